"""GloRo nets: the ⊥ logit, RTK / affinity variants and frozen bounds that cannot go stale (digest §8.1)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from modelward.robustness.gloro import (
    AffinityGloroNet,
    GloroNet,
    RtkGloroNet,
    build_gloro_model,
    certify,
)

torch.set_num_threads(1)


def _conv_net(seed: int = 0) -> nn.Sequential:
    return build_gloro_model("c(8,3,1).c(8,4,2).d(16)", (1, 8, 8), 4, seed=seed)


def _images(n: int = 200, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, 8, 8, generator=g)
    return x, torch.randint(4, (n,), generator=g)


def test_global_robustness_pairs_agree(blobs: Callable[..., Any], gloro_mlp: Callable[..., Any], eps_for: Callable[..., Any]) -> None:
    """Thm 6.2: two non-⊥ points within 2ε get the same label."""
    x, _ = blobs(400, seed=4)
    model = gloro_mlp(seed=5)
    net = GloroNet(model, (6,), eps_for(model, x, 0.5))
    cert = certify(net, x)
    xs, ps = x[cert.certified], cert.predictions[cert.certified]
    dist = torch.cdist(xs, xs)
    close = dist <= 2 * net.epsilon
    assert close.sum() > len(xs)  # some non-trivial close pairs exist
    assert bool((ps[:, None] == ps[None, :])[close].all())


def test_linear_model_certificate_is_exact() -> None:
    """T13: for a linear model, certified ⇔ min_i (f_j − f_i)/‖w_j − w_i‖ > ε."""
    torch.manual_seed(0)
    lin = nn.Linear(5, 4)
    net = GloroNet(nn.Sequential(lin), (5,), 0.3)
    x = torch.randn(300, 5)
    cert = certify(net, x)
    with torch.no_grad():
        f = lin(x)
        j = f.argmax(1)
        w = lin.weight
        dist = (f.gather(1, j[:, None]) - f) / (w[j][:, None, :] - w[None]).norm(dim=2).clamp_min(1e-12)
        dist[torch.arange(300), j] = float("inf")
        expect = dist.min(1).values > 0.3
    assert 0 < int(expect.sum()) < 300
    assert torch.equal(cert.certified, expect)


def test_basic_variant_never_certifies_more(blobs: Callable[..., Any], gloro_mlp: Callable[..., Any], eps_for: Callable[..., Any]) -> None:
    x, y = blobs(seed=6)
    model = gloro_mlp(seed=6)
    eps = eps_for(model, x, 0.5)
    margin = certify(GloroNet(model, (6,), eps), x, y)
    basic = certify(GloroNet(model, (6,), eps, variant="basic"), x, y)
    assert bool((basic.certified <= margin.certified).all()) and basic.certified.sum() < margin.certified.sum()


# -- relaxations -----------------------------------------------------------------------------------------------


def test_rtk1_and_singleton_affinity_equal_gloro(blobs: Callable[..., Any], gloro_mlp: Callable[..., Any], eps_for: Callable[..., Any]) -> None:
    x, y = blobs(seed=7)
    model = gloro_mlp(seed=7)
    eps = eps_for(model, x, 0.5)
    nets = [GloroNet(model, (6,), eps), RtkGloroNet(model, (6,), eps, k=1),
            AffinityGloroNet(model, (6,), eps, [[0], [1], [2], [3]])]
    outs = []
    for n in nets:
        n.freeze()
        outs.append(n.eval()(x))
    certs = [certify(n, x, y) for n in nets]
    for o, c in zip(outs[1:], certs[1:], strict=True):
        assert torch.allclose(o, outs[0], atol=1e-5)
        assert torch.equal(c.certified, certs[0].certified)
        assert c.vra == certs[0].vra
    assert 0 < certs[0].certified.sum() < len(x)


def test_affinity_with_all_small_subsets_equals_rtk_and_rtk_is_monotone(blobs: Callable[..., Any], gloro_mlp: Callable[..., Any], eps_for: Callable[..., Any]) -> None:
    x, y = blobs(seed=8, m=5)
    model = gloro_mlp(m=5, seed=8)
    eps = eps_for(model, x, 0.3)
    sets = [list(s) for r in (1, 2) for s in itertools.combinations(range(5), r)]
    rtk2 = certify(RtkGloroNet(model, (6,), eps, k=2), x, y)
    aff = certify(AffinityGloroNet(model, (6,), eps, sets), x, y)
    assert torch.equal(rtk2.certified, aff.certified) and torch.equal(rtk2.set_size, aff.set_size)
    rej = [certify(RtkGloroNet(model, (6,), eps, k=k), x, y).rejection_rate for k in (1, 2, 3, 4)]
    assert rej == sorted(rej, reverse=True) and rej[-1] < rej[0]


@pytest.mark.parametrize(("gradient", "expected"), [("full", 0.0), ("stop", -1.0)])
def test_rtk_bottom_gradient_variants(gradient: str, expected: float) -> None:
    """g_⊥ = max f − m(x). "full" (the reference library's later code) lets the gradient through max f; "stop" is
    the thesis' footnote 2 of ch. 7, stop_gradient(max f) − m(x)."""
    net = RtkGloroNet(nn.Sequential(nn.Linear(3, 4)), (3,), 0.1, k=2, bottom_gradient=gradient)
    logits = torch.tensor([[3.0, 1.0, 0.5, 0.0]], requires_grad=True)
    K = torch.zeros(4, 4)
    b = net.bottom(logits, K)
    b.backward()
    # m = max_k m^k; here k=1 wins: m = f_0 − f_1, so g_⊥ = f_1 (full) or const − f_0 + f_1 (stop)
    assert logits.grad[0, 0] == expected and logits.grad[0, 1] == 1.0
    with pytest.raises(Exception, match="bottom_gradient"):
        RtkGloroNet(nn.Sequential(nn.Linear(3, 4)), (3,), 0.1, k=2, bottom_gradient="half")


def test_rtk_sound_against_pgd_on_topk_sets(blobs: Callable[..., Any], gloro_mlp: Callable[..., Any], eps_for: Callable[..., Any]) -> None:
    x, y = blobs(seed=9, m=5)
    model = gloro_mlp(m=5, seed=9)
    eps = eps_for(model, x, 0.3)
    net = RtkGloroNet(model, (6,), eps, k=3)
    cert = certify(net, x, y)
    ok = cert.certified
    assert ok.any() and (cert.set_size > 1).any()
    g = torch.Generator().manual_seed(0)
    xs, ks = x[ok], cert.set_size[ok]
    with torch.no_grad():
        top = model(xs).argsort(1, descending=True)
        for _ in range(20):  # random points on the ε-sphere keep the certified top-k* set
            d = torch.randn(xs.shape, generator=g)
            xp = xs + eps * d / d.norm(dim=1, keepdim=True)
            topp = model(xp).argsort(1, descending=True)
            for i in range(len(xs)):
                k = int(ks[i])
                assert set(top[i, :k].tolist()) == set(topp[i, :k].tolist())


# -- refusals, layers, losses, schedules -------------------------------------------------------------------------


def test_batchnorm_only_in_eval_and_frozen_bound_expires_when_weights_change() -> None:
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3))
    model.eval()
    net = GloroNet(model, (4,), 0.1)
    net.eval()
    assert net.freeze().lipschitz_sub > 0 and net.frozen
    with torch.no_grad():
        model[0].weight.mul_(2.0)
    assert not net.frozen
    net.train()
    with pytest.raises(Exception, match="BatchNorm is not compatible"):
        net(torch.randn(8, 4))


# -- certificates that cannot go stale or low (issue 13 item 7) ------------------------------------------------


def test_frozen_bound_follows_data_edits_and_layer_swaps() -> None:
    x, y = _images()
    model = _conv_net()
    eps = 0.02
    net = GloroNet(model, (1, 8, 8), eps).eval()
    first = certify(net, x, y)
    assert net.frozen and 0 < first.certified.float().mean() < 1
    stale_K = net.frozen_K.clone()
    # an edit through .data bumps no version counter: the frozen bound must still expire
    net.f[0].weight.data[:2].mul_(4.0)
    assert not net.frozen
    edited = certify(net, x, y)
    fresh = certify(GloroNet(model, (1, 8, 8), eps), x, y)  # a net built from scratch on the edited model
    assert torch.equal(edited.certified, fresh.certified)
    with torch.no_grad():  # what the stale bound would have certified: more, i.e. falsely
        stale = net.top_k_margins(model(x), stale_K)[:, 0] > 0
    assert stale.sum() > edited.certified.sum() and (stale & ~edited.certified).any()
    # swapping a layer: the per-layer bounds are rebuilt for the new layer, even after freeze()
    before_swap_K = net.frozen_K.clone()
    big = nn.Conv2d(1, 8, 3, 1, 1)
    with torch.no_grad():
        big.weight.copy_(model[0].weight)
        big.weight[2:5] *= 4.0
        big.bias.copy_(model[0].bias)
    net.f[0] = big
    assert not net.frozen
    rep = net.freeze()
    assert rep.layers[0].value == pytest.approx(float(torch.linalg.svdvals(
        net.sub.seq.parts[0].matrix())[0]), rel=1e-9)
    swapped = certify(net, x, y)
    assert torch.equal(swapped.certified, certify(GloroNet(model, (1, 8, 8), eps), x, y).certified)
    with torch.no_grad():
        old_layer = net.top_k_margins(model(x), before_swap_K)[:, 0] > 0
    assert old_layer.sum() > swapped.certified.sum()


def test_eval_forward_without_freeze_uses_the_certified_bound() -> None:
    x, _ = _images(50)
    model = _conv_net(1)
    net = GloroNet(model, (1, 8, 8), 0.05)
    net.train()
    net(x)  # training steps: a few power iterations, a lower estimate of each norm
    lower = net.margin_lipschitz(0).detach()
    net.eval()
    out = net(x)  # must not use the iterates
    assert net.frozen
    exact = GloroNet(model, (1, 8, 8), 0.05)
    exact.freeze()
    assert torch.equal(net.frozen_K, exact.frozen_K) and (net.frozen_K >= lower - 1e-6).all()
    with torch.no_grad():
        f = model(x)
    assert torch.allclose(out[:, -1], net.bottom(f, exact.frozen_K))


