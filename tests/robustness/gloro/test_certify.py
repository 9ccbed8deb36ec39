"""GloRo certification: certified points survive strong attacks; certified radii are the thresholds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from modelward.robustness.attacks import make_attack
from modelward.robustness.gloro import (
    GloroNet,
    certify,
)

torch.set_num_threads(1)


def test_certified_points_survive_pgd_with_restarts(blobs: Callable[..., Any], gloro_mlp: Callable[..., Any], eps_for: Callable[..., Any]) -> None:
    x, y = blobs()
    model = gloro_mlp(seed=2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):  # a little standard training gives a mix of certified and rejected points
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    eps = eps_for(model, x, 0.5)
    net = GloroNet(model, (6,), eps)
    cert = certify(net, x, y, epsilon=eps)
    ok = cert.certified
    assert 0.2 < ok.float().mean() < 1.0
    pred = cert.predictions
    xs, ps = x[ok], pred[ok]
    pgd = make_attack("pgd", model, eps=eps, norm="l2", steps=40, restarts=8, alpha=eps / 8, seed=0,
                      clip=(-10.0, 10.0))
    res = pgd(xs, ps)
    assert float((res.x_adv - xs).norm(dim=1).max()) <= eps * (1 + 1e-5)
    assert not bool(res.success.any()), "a certified point was flipped inside its ε-ball"
    # the same attack at a radius well beyond the certificate does flip some of these points
    big = make_attack("pgd", model, eps=8 * float(net.frozen_K.max()) * eps, norm="l2", steps=40, restarts=2,
                      seed=0, clip=(-10.0, 10.0))
    assert bool(big(xs, ps).success.any())


def test_certified_radius_is_the_certification_threshold(blobs: Callable[..., Any], gloro_mlp: Callable[..., Any]) -> None:
    from modelward.robustness.gloro import certified_radius

    x, _ = blobs(80)
    net = GloroNet(gloro_mlp(), (6,), 0.0)
    r = certified_radius(net, x)
    assert r.shape == (80,) and bool((r > 0).all()) and bool(torch.isfinite(r).all())
    assert bool(certify(net, x, epsilon=float(r.median()) * 0.999).certified.any())
    for i in range(0, 80, 7):  # ε just below / above a point's radius certifies / rejects exactly that point
        assert bool(certify(net, x[i : i + 1], epsilon=float(r[i]) * 0.999).certified[0])
        assert not bool(certify(net, x[i : i + 1], epsilon=float(r[i]) * 1.001).certified[0])
