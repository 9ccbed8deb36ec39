"""Internal influence (seed 002 Def. 3.2) and the axioms of §4.1 as tests (digest T1–T5)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from modelward.errors import ConfigError
from modelward.explain.influence import (
    ChannelQoI,
    ClassQoI,
    ComparativeQoI,
    DatasetDoI,
    GaussianDoI,
    InternalInfluence,
    LambdaQoI,
    LinearDoI,
    MixtureDoI,
    PointDoI,
    Slice,
    UnitQoI,
    completeness_gap,
    path_alphas,
)
from modelward.explain.methods import gradient_x_input, integrated_gradients, saliency, smoothgrad


def _mlp(seed: int = 0) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 8), nn.Softplus(), nn.Linear(8, 3)).double()
    for p in net.parameters():
        p.data = torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.7
    return net.eval()


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    return torch.randn(5, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def test_linear_agreement_any_doi(x: torch.Tensor) -> None:
    """Axiom 4.1: for (q∘f)(x) = wᵀx + b the influence is w, whatever the distribution of interest."""
    lin = nn.Linear(6, 3).double()
    w = lin.weight.detach()
    for doi in (PointDoI(), LinearDoI(steps=7, rule="riemann_middle"), GaussianDoI(std=2.0, samples=9),
                DatasetDoI(torch.randn(11, 6, dtype=torch.float64))):
        infl = InternalInfluence(lin, None, 1, doi).influence(x)
        assert torch.allclose(infl, w[1].expand_as(infl), atol=1e-12), type(doi).__name__
    # comparative QoI of a linear model: w_a − w_b
    infl = InternalInfluence(lin, None, (0, 2), PointDoI()).influence(x)
    assert torch.allclose(infl, (w[0] - w[2]).expand_as(infl), atol=1e-12)


def test_distributional_linearity(x: torch.Tensor) -> None:
    """Axiom 4.3: χ over a mixture α·P1 + (1 − α)·P2 is α·χ(P1) + (1 − α)·χ(P2)."""
    net = _mlp()
    p1, p2 = GaussianDoI(std=0.5, samples=6, seed=1), LinearDoI(steps=5)
    c1 = InternalInfluence(net, "2", 0, p1).influence(x)
    c2 = InternalInfluence(net, "2", 0, p2).influence(x)
    mix = InternalInfluence(net, "2", 0, MixtureDoI([(0.3, p1), (0.7, p2)])).influence(x)
    assert torch.allclose(mix, 0.3 * c1 + 0.7 * c2, atol=1e-12)
    assert not torch.allclose(c1, c2)  # the check is not vacuous


def test_preprocessing_axiom(x: torch.Tensor) -> None:
    """Axiom 4.4 (Theorem 4.2): χ(g∘h, q, D_X) equals the input influence of g over the push-forward {h(x)}."""
    net = _mlp()
    data = torch.randn(20, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    internal = InternalInfluence(net, "1", 2, DatasetDoI(data)).influence(x[:1])
    g = nn.Sequential(*list(net.children())[2:])
    z = net[1](net[0](data)).detach()
    pushed = InternalInfluence(g, None, 2, DatasetDoI(z)).influence(x[:1])
    assert torch.allclose(internal, pushed, atol=1e-12)
    # by hand: the mean of the per-point gradients of g at h(x)
    zz = z.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(g(zz)[:, 2].sum(), zz)
    assert torch.allclose(internal[0], grad.mean(0), atol=1e-12)


def test_special_cases_are_their_dois(x: torch.Tensor) -> None:
    """§3.4: saliency = point gradient, SmoothGrad = Gaussian mean gradient, IG = (x − x0) ⊙ path mean."""
    net = _mlp()
    xx = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(net(xx)[:, 1].sum(), xx)
    assert torch.allclose(saliency(net, x, 1), grad, atol=1e-12)
    assert torch.allclose(gradient_x_input(net, x, 1), grad * x, atol=1e-12)
    # SmoothGrad by hand with the same seeded noise
    g = torch.Generator().manual_seed(4)
    noise = torch.randn((10, *x.shape), generator=g, dtype=torch.float64)
    pts = (x[None] + 0.3 * noise).reshape(-1, 6).requires_grad_(True)
    (gp,) = torch.autograd.grad(net(pts)[:, 1].sum(), pts)
    assert torch.allclose(smoothgrad(net, x, 1, std=0.3, samples=10, seed=4), gp.reshape(10, 5, 6).mean(0), atol=1e-12)
    ig = integrated_gradients(net, x, 1, steps=16, rule="riemann_left")
    a, _ = path_alphas(16, "riemann_left")
    path = torch.stack([float(t) * x for t in a]).reshape(-1, 6).requires_grad_(True)
    (gpath,) = torch.autograd.grad(net(path)[:, 1].sum(), path)
    assert torch.allclose(ig, x * gpath.reshape(16, 5, 6).mean(0), atol=1e-12)


@pytest.mark.parametrize("layer", [None, "2"])
def test_completeness_gap_shrinks_with_steps(x: torch.Tensor, layer: str | None) -> None:
    """Eq. 3.3 efficiency: Σ attribution → q(x) − q(x0) for a straight path in the slice's own space (the input,
    or the latent space of layer "2"); the gap shrinks as the path resolution grows."""
    net = _mlp()

    def gap(n: int, rule: str) -> float:
        ii = InternalInfluence(net, layer, 0, LinearDoI(steps=n, rule=rule, space="slice"))
        return completeness_gap(ii, x).abs().max().item()

    gaps = [gap(n, "riemann_middle") for n in (2, 8, 64)]
    assert gaps[0] > gaps[1] > gaps[2]
    assert gaps[2] < 0.05 * gaps[0]
    assert gap(64, "gausslegendre") < 1e-8


def test_input_path_at_internal_slice_is_not_complete(x: torch.Tensor) -> None:
    """A straight path in *input* space is curved in the latent space, so influence × (h(x) − h(x0)) at an
    internal slice does not sum to q(x) − q(x0) (Captum's InternalInfluence makes no such claim either)."""
    net = _mlp()
    ii = InternalInfluence(net, "2", 0, LinearDoI(steps=64, rule="gausslegendre", space="input"))
    assert completeness_gap(ii, x).abs().max().item() > 1e-3


def test_sensitivity(x: torch.Tensor) -> None:
    """IG sensitivity: inputs differing from the baseline in one feature, with different outputs, get a non-zero
    attribution on that feature (and zero on the others)."""
    net = _mlp()
    base = x[:1].clone()
    moved = base.clone()
    moved[0, 3] += 1.5
    attr = InternalInfluence(net, None, 0, LinearDoI(base, steps=64)).attribution(moved)
    assert net(moved)[0, 0] != net(base)[0, 0]
    assert abs(attr[0, 3].item()) > 1e-6
    assert torch.count_nonzero(attr[0, [0, 1, 2, 4, 5]]) == 0


def test_qois_and_batching(x: torch.Tensor) -> None:
    net = _mlp()
    per_input = ClassQoI((0, 1, 2, 0, 1))
    full = InternalInfluence(net, "1", per_input, GaussianDoI(0.2, 7)).influence(x)
    chunked = InternalInfluence(net, "1", per_input, GaussianDoI(0.2, 7), batch_size=3).influence(x)
    assert torch.allclose(full, chunked, atol=1e-12)
    # comparative QoI is the difference of class influences (T5)
    a = InternalInfluence(net, "1", 0, PointDoI()).influence(x)
    b = InternalInfluence(net, "1", 2, PointDoI()).influence(x)
    c = InternalInfluence(net, "1", ComparativeQoI(0, 2), PointDoI()).influence(x)
    assert torch.allclose(c, a - b, atol=1e-12)
    lam = InternalInfluence(net, "1", LambdaQoI(lambda y: y[:, 0] - y[:, 2]), PointDoI()).influence(x)
    assert torch.allclose(lam, c, atol=1e-12)


def test_unit_qoi_localises_a_unit(x: torch.Tensor) -> None:
    """§3.3: Slice(None, layer) with q(z) = z_i is the input gradient of that unit."""
    net = _mlp()
    xx = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(net[2](net[1](net[0](xx)))[:, 5].sum(), xx)
    infl = InternalInfluence(net, Slice(None, "2"), UnitQoI(5), PointDoI()).influence(x)
    assert torch.allclose(infl, grad, atol=1e-12)


def test_conv_channel_and_inplace_relu() -> None:
    from modelward.core.zoo import SmallCNN

    torch.manual_seed(0)
    cnn = SmallCNN((1, 8, 8), [4, 6], 8, 3).eval()
    xb = torch.rand(3, 1, 8, 8)
    # conv1.0.bn is followed by an in-place ReLU: the slice must still work
    infl = InternalInfluence(cnn, "conv1.0.bn", 1, LinearDoI(steps=8)).influence(xb)
    assert infl.shape == (3, 4, 8, 8) and torch.isfinite(infl).all()
    active = int(InternalInfluence(cnn, "conv2").activation(xb).sum((0, 2, 3)).argmax())
    ch = InternalInfluence(cnn, Slice(None, "conv2"), ChannelQoI(active), PointDoI()).influence(xb)
    assert ch.shape == xb.shape and ch.abs().sum() > 0


def test_bad_inputs_are_named() -> None:
    net = _mlp()
    with pytest.raises(ConfigError, match="valid layers"):
        InternalInfluence(net, "nope", 0)
    with pytest.raises(ConfigError, match="valid choices"):
        LinearDoI(rule="simpson")
    with pytest.raises(ConfigError, match="out of range"):
        InternalInfluence(net, None, 7).influence(torch.zeros(1, 6, dtype=torch.float64))
    with pytest.raises(ConfigError, match="does not depend"):
        InternalInfluence(net, Slice("2", "0"), UnitQoI(0)).influence(torch.zeros(1, 6, dtype=torch.float64))
