"""IBP and CROWN: sound (bounds contain every sampled and attacked output; no certified point falls to AutoAttack),
exact on a linear model, CROWN never looser than IBP, unsupported layers refused all at once."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from modelward.robustness.attacks import APGD, AutoAttack
from modelward.robustness.attacks.base import predict
from modelward.robustness.bounds import UnsupportedLayerError, certify_bounds, output_bounds

torch.set_num_threads(1)


def _cnn(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                        nn.Linear(64, 24), nn.ReLU(), nn.Linear(24, 10)).eval()
    with torch.no_grad():
        net[1].running_mean.uniform_(-0.1, 0.1)
        net[1].running_var.uniform_(0.5, 2.0)
    return net


def _ball_samples(x: torch.Tensor, eps: float, norm: str, k: int, gen: torch.Generator) -> torch.Tensor:
    xs = x.repeat(k, *([1] * (x.dim() - 1)))
    if norm == "linf":
        signs = torch.randint(0, 2, xs.shape, generator=gen).float() * 2 - 1  # vertices hit the extremes
        return (xs + eps * signs * torch.rand(xs.shape, generator=gen).pow(0.2)).clamp(0, 1)
    d = torch.randn(xs.shape, generator=gen)
    return xs + eps * d / d.flatten(1).norm(dim=1).view(-1, *([1] * (x.dim() - 1)))


@pytest.mark.parametrize("method", ["ibp", "crown"])
@pytest.mark.parametrize("norm,eps", [("linf", 0.03), ("l2", 0.3)])
def test_bounds_contain_every_sampled_and_attacked_output(method, norm, eps):
    net = _cnn()
    x = torch.rand(6, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    lo, hi = output_bounds(net, x, eps, norm, method)
    gen = torch.Generator().manual_seed(2)
    z = net(_ball_samples(x, eps, norm, 300, gen)).double().view(300, 6, 10)
    assert bool((z >= lo - 1e-6).all()) and bool((z <= hi + 1e-6).all())
    # the attacked margins respect the certified margin lower bounds
    y = predict(net, x)
    cert = certify_bounds(net, x, y, eps, norm, method)
    adv = APGD(net, eps=eps, norm=norm, steps=30, seed=0)(x, y).x_adv
    logits = net(adv).double()
    margins = logits.gather(1, y[:, None]) - logits
    other = torch.isfinite(cert.margin_lower)  # the j = y entry is +inf by convention
    assert int(other.sum()) == 6 * 9 and bool((margins[other] >= cert.margin_lower[other] - 1e-6).all())
    assert bool((logits >= lo - 1e-6).all()) and bool((logits <= hi + 1e-6).all())


def test_linear_model_bounds_are_exact():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(16, 4))
    x, y = torch.rand(3, 16) * 0.5 + 0.25, torch.tensor([0, 1, 2])  # interior: the box does not bind at ε = 0.1
    w, b = net[1].weight.double(), net[1].bias.double()
    for norm, dual in (("linf", 1), ("l2", 2)):
        exact = torch.stack([(w[y[i]] - w) @ x[i].double() + b[y[i]] - b - 0.1 * (w[y[i]] - w).norm(p=dual, dim=1)
                             for i in range(3)])
        for method in ("ibp", "crown"):
            got = certify_bounds(net, x, y, 0.1, norm, method).margin_lower
            mask = torch.ones_like(got, dtype=torch.bool)
            mask[torch.arange(3), y] = False
            assert torch.allclose(got[mask], exact[mask], atol=1e-9)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), eps=st.floats(0.0, 0.3), norm=st.sampled_from(["linf", "l2"]),
       width=st.integers(2, 12))
def test_crown_is_never_looser_than_ibp(seed, eps, norm, width):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(5, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 4))
    x = torch.rand(3, 5)
    y = torch.tensor([0, 1, 3])
    ibp = certify_bounds(net, x, y, eps, norm, "ibp")
    crown = certify_bounds(net, x, y, eps, norm, "crown")
    assert bool((crown.margin_lower >= ibp.margin_lower - 1e-9).all())
    assert bool((crown.certified | ~ibp.certified).all())
    lo_i, hi_i = output_bounds(net, x, eps, norm, "ibp")
    lo_c, hi_c = output_bounds(net, x, eps, norm, "crown")
    assert bool((lo_c >= lo_i - 1e-9).all()) and bool((hi_c <= hi_i + 1e-9).all())


def test_no_certified_point_falls_to_autoattack(victim, batch):
    x, y = batch[0][:30], batch[1][:30]
    eps = 0.02
    cert = certify_bounds(victim, x, y, eps, "linf", "crown")
    assert cert.certified.sum() >= 5  # the test means something
    assert cert.certified_accuracy >= certify_bounds(victim, x, y, eps, "linf", "ibp").certified_accuracy
    xc, yc = x[cert.certified], y[cert.certified]
    res = AutoAttack(victim, eps=eps, norm="linf", seed=0, steps=50, n_queries=300)(xc, yc)
    assert not bool(res.success.any())


def test_unsupported_layers_are_refused_all_at_once():
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Tanh(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8, 3))
    with pytest.raises(UnsupportedLayerError, match=r"2 layer\(s\): 1 \(Tanh\), 2 \(MaxPool2d\); supported"):
        certify_bounds(net, torch.rand(1, 1, 6, 6), torch.tensor([0]), 0.1)


def test_the_zoo_mlp_is_verified_through_its_sequential_form():
    from modelward.core.zoo import ModelConfig, build_model

    torch.manual_seed(0)
    mlp = build_model(ModelConfig(arch="mlp", hidden=[12, 8]), (1, 4, 4), 3).eval()
    x = torch.rand(4, 1, 4, 4)
    lo, hi = output_bounds(mlp, x, 0.05, "linf", "crown")
    z = mlp(_ball_samples(x, 0.05, "linf", 100, torch.Generator().manual_seed(0))).double().view(100, 4, 3)
    assert bool((z >= lo - 1e-6).all()) and bool((z <= hi + 1e-6).all())
