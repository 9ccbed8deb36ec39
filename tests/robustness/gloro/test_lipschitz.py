"""GloRo Lipschitz bounds: operator norms, sound upper bounds for every layer kind (seed 002 §6; digest §8.1)."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from modelward.robustness.gloro import (
    GloroNet,
    MinMax,
    Residual,
    UnknownLipschitzError,
    build_gloro_model,
    empirical_lipschitz,
    operator_norm,
)
from modelward.robustness.gloro.lipschitz import ConvBound, LipschitzBound

torch.set_num_threads(1)


def _conv_net(seed: int = 0) -> nn.Sequential:
    return build_gloro_model("c(8,3,1).c(8,4,2).d(16)", (1, 8, 8), 4, seed=seed)


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


