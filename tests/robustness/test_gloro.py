"""GloRo soundness and correctness (issue 5 item 6; digest §8.1 T6–T17)."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from modelward.robustness.attacks import make_attack
from modelward.robustness.gloro import (
    AffinityGloroNet,
    GloroNet,
    MinMax,
    Residual,
    RtkGloroNet,
    Schedule,
    UnknownLipschitzError,
    build_gloro_model,
    certify,
    decay_to,
    empirical_lipschitz,
    gloro_cross_entropy,
    gloro_trades_loss,
    operator_norm,
)
from modelward.robustness.gloro.lipschitz import ConvBound, LipschitzBound

torch.set_num_threads(1)


def _blobs(n: int = 240, m: int = 4, d: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    centers = torch.rand(m, d, generator=g)
    y = torch.randint(m, (n,), generator=g)
    x = (centers[y] + 0.08 * torch.randn(n, d, generator=g)).clamp(0, 1)
    return x, y


def _mlp(d: int = 6, m: int = 4, seed: int = 0) -> nn.Sequential:
    return build_gloro_model("d(16).d(16)", (d,), m, seed=seed)


def _eps_for(model: nn.Module, x: torch.Tensor, q: float) -> float:
    """An ε at which about a fraction ``q`` of the points is certified: the q-quantile of the certified radii."""
    net = GloroNet(model, tuple(x.shape[1:]), 0.0)
    net.freeze()
    with torch.no_grad():
        f = model(x)
        j = f.argmax(1)
        r = (f.gather(1, j[:, None]) - f) / net.frozen_K[j].clamp_min(1e-12)
        r[torch.arange(len(x)), j] = float("inf")
        return float(r.min(1).values.quantile(1 - q))


# -- operator norms --------------------------------------------------------------------------------------------
def test_power_iteration_matches_svd_for_dense() -> None:
    g = torch.Generator().manual_seed(1)
    lin = nn.Linear(60, 40)
    nn.init.xavier_uniform_(lin.weight, generator=g)
    sigma = float(torch.linalg.svdvals(lin.weight.detach().double())[0])
    assert operator_norm(lin, (60,), n_iter=300) == pytest.approx(sigma, rel=1e-4)
    assert operator_norm(lin, (60,), n_iter=1) < sigma * (1 + 1e-6)  # power iteration approaches from below


@pytest.mark.parametrize("stride,padding,dilation,groups", [(1, 1, 1, 1), (2, 1, 1, 1), (2, 0, 1, 2), (1, 2, 2, 1)])
def test_power_iteration_matches_explicit_conv_matrix(stride: int, padding: int, dilation: int, groups: int) -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, 3, stride, padding, dilation, groups)
    shape = (4, 7, 7)
    # independent reference: the Jacobian of the bias-free conv is its matrix
    jac = torch.autograd.functional.jacobian(
        lambda z: nn.functional.conv2d(z, conv.weight.detach().double(), None, stride, padding, dilation, groups),
        torch.zeros(1, *shape, dtype=torch.float64))
    sigma = float(torch.linalg.svdvals(jac.reshape(-1, 4 * 7 * 7))[0])
    bound = ConvBound("c", conv, shape, seed=0)
    val, _ = bound.converge(tol=1e-12, max_iter=5000)
    assert val == pytest.approx(sigma, rel=1e-6)
    exact = bound.certified(1e-9, 10, exact_limit=10**8)[0]
    assert exact.method == "exact" and exact.value == pytest.approx(sigma, rel=1e-9)
    # a fixed iteration budget approaches σ from below (slowly when the spectral gap is small), hence the exact
    # SVD / converged float64 value at certification time
    approx = operator_norm(conv, shape, n_iter=500)
    assert sigma * (1 - 5e-3) <= approx <= sigma * (1 + 1e-5)


def test_power_gradient_is_leading_singular_direction() -> None:
    torch.manual_seed(0)
    lin = nn.Linear(12, 9)
    lb = LipschitzBound([("0", lin)], (12,))
    lb.converge(tol=1e-12, max_iter=5000)
    lb(0).backward()
    u, s, vh = torch.linalg.svd(lin.weight.detach())
    expect = torch.outer(u[:, 0], vh[0])
    cos = nn.functional.cosine_similarity(lin.weight.grad.flatten(), expect.flatten(), dim=0)
    assert abs(float(cos)) > 0.999


# -- the Lipschitz bound is an upper bound -----------------------------------------------------------------------
def test_bound_dominates_empirical_ratios_and_jacobians() -> None:
    torch.manual_seed(0)
    model = build_gloro_model("c(4,3,1).c(8,4,2).d(16)", (1, 8, 8), 5, seed=3)
    net = GloroNet(model, (1, 8, 8), 0.1)
    rep = net.freeze()
    K = net.frozen_K.double()
    x = torch.rand(64, 1, 8, 8)
    full = rep.lipschitz_sub * float(torch.linalg.matrix_norm(model[-1].weight.detach().double(), 2))
    lb_logits = empirical_lipschitz(model, x, kind="logits", n_pairs=64, steps=30, seed=1)
    lb_margin = empirical_lipschitz(model, x, kind="margin", n_pairs=64, steps=30, seed=1)
    assert 0 < lb_logits <= full
    assert 0 < lb_margin <= float(K.max())
    # Jacobian of every margin f_j - f_i at random points
    for xi in x[:8]:
        jac = torch.autograd.functional.jacobian(lambda z: model(z[None])[0], xi).reshape(5, -1).double()
        assert float(torch.linalg.matrix_norm(jac, 2)) <= full * (1 + 1e-6)
        for i, j in itertools.permutations(range(5), 2):
            assert float((jac[j] - jac[i]).norm()) <= float(K[i, j]) * (1 + 1e-6)


# -- soundness: certified points are never flipped --------------------------------------------------------------
def test_certified_points_survive_pgd_with_restarts() -> None:
    x, y = _blobs()
    model = _mlp(seed=2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):  # a little standard training gives a mix of certified and rejected points
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    eps = _eps_for(model, x, 0.5)
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


def test_global_robustness_pairs_agree() -> None:
    """Thm 6.2: two non-⊥ points within 2ε get the same label."""
    x, _ = _blobs(400, seed=4)
    model = _mlp(seed=5)
    net = GloroNet(model, (6,), _eps_for(model, x, 0.5))
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


def test_basic_variant_never_certifies_more() -> None:
    x, y = _blobs(seed=6)
    model = _mlp(seed=6)
    eps = _eps_for(model, x, 0.5)
    margin = certify(GloroNet(model, (6,), eps), x, y)
    basic = certify(GloroNet(model, (6,), eps, variant="basic"), x, y)
    assert bool((basic.certified <= margin.certified).all()) and basic.certified.sum() < margin.certified.sum()


# -- relaxations -----------------------------------------------------------------------------------------------
def test_rtk1_and_singleton_affinity_equal_gloro() -> None:
    x, y = _blobs(seed=7)
    model = _mlp(seed=7)
    eps = _eps_for(model, x, 0.5)
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


def test_affinity_with_all_small_subsets_equals_rtk_and_rtk_is_monotone() -> None:
    x, y = _blobs(seed=8, m=5)
    model = _mlp(m=5, seed=8)
    eps = _eps_for(model, x, 0.3)
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


def test_rtk_sound_against_pgd_on_topk_sets() -> None:
    x, y = _blobs(seed=9, m=5)
    model = _mlp(m=5, seed=9)
    eps = _eps_for(model, x, 0.3)
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
def test_unknown_layer_is_refused_with_its_name() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 3))
    with pytest.raises(UnknownLipschitzError, match=r"layer '1' \(GELU\)"):
        GloroNet(model, (4,), 0.1)
    nested = nn.Sequential(nn.Sequential(nn.Linear(4, 8), nn.SiLU()), nn.Linear(8, 3))
    with pytest.raises(UnknownLipschitzError, match=r"'0\.1' \(SiLU\)"):
        GloroNet(nested, (4,), 0.1)


def test_residual_bound_is_sum_of_branches() -> None:
    torch.manual_seed(0)
    lin = nn.Linear(6, 6)
    model = nn.Sequential(Residual(nn.Sequential(lin, MinMax())), nn.Linear(6, 3))
    net = GloroNet(model, (6,), 0.1)
    rep = net.freeze()
    sigma = float(torch.linalg.svdvals(lin.weight.detach().double())[0])
    assert rep.lipschitz_sub == pytest.approx(sigma + 1.0, rel=1e-9)


def test_minmax_is_a_gradient_norm_preserving_permutation() -> None:
    x = torch.randn(5, 8, 3, 3, requires_grad=True)
    out = MinMax()(x)
    assert torch.equal(out.sort(1).values, x.sort(1).values)
    gout = torch.randn_like(out)
    (gx,) = torch.autograd.grad(out, x, gout)
    assert torch.allclose(gx.flatten(1).norm(dim=1), gout.flatten(1).norm(dim=1))


def test_losses() -> None:
    logits = torch.tensor([[2.0, 0.0, -1.0]], requires_grad=True)
    gl = torch.cat([logits, torch.tensor([[1.0]])], 1)
    y = torch.tensor([0])
    assert float(gloro_cross_entropy(gl, y)) == pytest.approx(float(nn.functional.cross_entropy(gl, y)))
    # λ = 0 reduces TRADES to plain CE; a larger ⊥ logit increases the robust term
    assert float(gloro_trades_loss(logits, gl, y, 0.0)) == pytest.approx(float(nn.functional.cross_entropy(logits, y)))
    hi = torch.cat([logits, torch.tensor([[5.0]])], 1)
    assert gloro_trades_loss(logits, hi, y, 1.0) > gloro_trades_loss(logits, gl, y, 1.0)
    assert gloro_trades_loss(logits, hi, y, 1.0, "ce") > gloro_trades_loss(logits, gl, y, 1.0, "ce")


def test_schedules() -> None:
    lin = Schedule(kind="linear", start=0.1, end=2.0, until=1.0)
    assert lin.at(0, 100) == pytest.approx(0.1) and lin.at(50, 100) == pytest.approx(1.05)
    assert lin.at(100, 100) == pytest.approx(2.0) and lin.at(150, 100) == pytest.approx(2.0)
    log = Schedule(kind="log", start=0.0, end=1.0)
    assert log.at(0, 10) == pytest.approx(0.0) and log.at(5, 10) == pytest.approx(1.0)
    assert log.at(2.5, 10) > 0.5  # concave: faster than linear early on
    assert Schedule(kind="single", end=0.3).at(0, 10) == 0.3
    assert decay_to(1e-3, 1e-6, 40, 100) == 1e-3
    assert decay_to(1e-3, 1e-6, 100, 100) == pytest.approx(1e-6)
    assert decay_to(1e-3, 1e-6, 75, 100) == pytest.approx((1e-3 * 1e-6) ** 0.5)


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
def _conv_net(seed: int = 0) -> nn.Sequential:
    return build_gloro_model("c(8,3,1).c(8,4,2).d(16)", (1, 8, 8), 4, seed=seed)


def _images(n: int = 200, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, 8, 8, generator=g)
    return x, torch.randint(4, (n,), generator=g)


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


def test_large_layers_get_a_proven_upper_bound_not_a_power_estimate() -> None:
    model = _conv_net(2)
    net = GloroNet(model, (1, 8, 8), 0.1)
    exact = net.freeze()
    assert {r.method for r in exact.layers if r.kind == "Conv2d"} == {"exact"}
    big = net.freeze(exact_limit=0)  # treat every layer as too large for the explicit SVD
    convs = [(e, b) for e, b in zip(exact.layers, big.layers, strict=True) if e.kind == "Conv2d"]
    assert convs and all(b.method == "circulant-fft" for _, b in convs)
    for e, b in convs:
        assert e.value <= b.value <= 1.6 * e.value  # sound, and not far above the exact norm
    assert big.lipschitz_sub >= exact.lipschitz_sub
    pool = LipschitzBound([("p", nn.AvgPool2d(3, 2, 1))], (2, 9, 9))
    ex, (layer,) = pool.certified()
    ub, (layer_ub,) = pool.certified(exact_limit=0)
    assert layer_ub.method == "schur" and ex <= ub


@pytest.mark.parametrize("cfg", [(2, 4, 3, 1, 1, 1, 1, 8), (3, 6, 4, 2, 1, 1, 1, 9), (4, 4, 3, 1, 2, 2, 2, 7),
                                 (2, 3, 5, 3, 0, 1, 1, 11), (4, 6, 3, 2, 1, 2, 2, 10)])
def test_circulant_bound_is_above_the_exact_conv_norm(cfg: tuple[int, ...]) -> None:
    from modelward.robustness.gloro.lipschitz import conv_circulant_bound

    ci, co, k, s, p, d, g, h = cfg
    torch.manual_seed(sum(cfg))
    conv = nn.Conv2d(ci, co, k, s, p, d, g)
    b = ConvBound("c", conv, (ci, h, h), 0)
    exact = float(torch.linalg.svdvals(b.matrix())[0])
    ub = conv_circulant_bound(conv.weight, (h, h), b.pad, conv.dilation, g, conv.stride)
    assert exact * (1 - 1e-12) <= ub <= 1.25 * exact


def test_certified_radius_is_the_certification_threshold() -> None:
    from modelward.robustness.gloro import certified_radius

    x, _ = _blobs(80)
    net = GloroNet(_mlp(), (6,), 0.0)
    r = certified_radius(net, x)
    assert r.shape == (80,) and bool((r > 0).all()) and bool(torch.isfinite(r).all())
    assert bool(certify(net, x, epsilon=float(r.median()) * 0.999).certified.any())
    for i in range(0, 80, 7):  # ε just below / above a point's radius certifies / rejects exactly that point
        assert bool(certify(net, x[i : i + 1], epsilon=float(r[i]) * 0.999).certified[0])
        assert not bool(certify(net, x[i : i + 1], epsilon=float(r[i]) * 1.001).certified[0])
