"""Agreement with Captum (a test-only dependency) in float64: same model, layer, target and path rule."""

from __future__ import annotations

import pytest
import torch

from modelward.core.zoo import SmallCNN
from modelward.explain.influence import ClassQoI, InternalInfluence, LinearDoI
from modelward.explain.methods import integrated_gradients

captum_attr = pytest.importorskip("captum.attr")

RULES = ["gausslegendre", "riemann_left", "riemann_middle", "riemann_right"]


@pytest.fixture(scope="module")
def setup() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = SmallCNN((1, 8, 8), [4, 8], 16, 5).double().eval()
    x = torch.rand(4, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    return model, x, torch.tensor([0, 1, 2, 4])


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("layer", ["conv2", "fc1"])
def test_internal_influence_matches_captum(setup, rule: str, layer: str) -> None:  # type: ignore[no-untyped-def]
    model, x, t = setup
    base = torch.full_like(x, 0.25)
    ours = InternalInfluence(model, layer, ClassQoI(tuple(t.tolist())), LinearDoI(base, steps=12, rule=rule)).influence(x)
    theirs = captum_attr.InternalInfluence(model, dict(model.named_modules())[layer]).attribute(
        x, baselines=base, target=t, n_steps=12, method=rule)
    assert ours.shape == theirs.shape
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("rule", ["gausslegendre", "riemann_middle"])
@pytest.mark.parametrize("layer", ["conv1", "fc1"])
def test_layer_integrated_gradients_matches_captum(setup, rule: str, layer: str) -> None:  # type: ignore[no-untyped-def]
    model, x, t = setup
    ours = integrated_gradients(model, x, ClassQoI(tuple(t.tolist())), steps=10, rule=rule, layer=layer)
    theirs = captum_attr.LayerIntegratedGradients(model, dict(model.named_modules())[layer]).attribute(
        x, target=t, n_steps=10, method=rule)
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("rule", RULES)
def test_integrated_gradients_matches_captum(setup, rule: str) -> None:  # type: ignore[no-untyped-def]
    model, x, t = setup
    base = torch.rand(1, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    ours = integrated_gradients(model, x, ClassQoI(tuple(t.tolist())), baseline=base, steps=16, rule=rule)
    theirs = captum_attr.IntegratedGradients(model).attribute(x, baselines=base.expand_as(x), target=t, n_steps=16,
                                                              method=rule)
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=0)


def test_trapezoid_differs_from_captum_by_its_weights(setup) -> None:  # type: ignore[no-untyped-def]
    """Captum's riemann_trapezoid weights sum to (n−1)/n; ours are the trapezoid rule (sum 1): the influences differ
    by exactly that factor (documented in docs/explain.md)."""
    model, x, t = setup
    n = 8
    ours = InternalInfluence(model, "fc1", ClassQoI(tuple(t.tolist())), LinearDoI(steps=n, rule="riemann_trapezoid"))
    theirs = captum_attr.InternalInfluence(model, model.fc1).attribute(x, target=t, n_steps=n,
                                                                       method="riemann_trapezoid")
    assert torch.allclose(ours.influence(x) * (n - 1) / n, theirs, atol=1e-5, rtol=0)
