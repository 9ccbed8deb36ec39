"""Interpretation helpers (seed 002 §3.3): top units, localisation by attribution / inversion, model comparison."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from modelward.errors import ConfigError
from modelward.explain.interpret import (
    compare_models,
    concentration,
    top_units,
    unit_attribution,
    unit_inversion,
)


def _net() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    with torch.no_grad():
        net[0].weight.copy_(torch.eye(6, 4))  # hidden unit i copies input i (units 4, 5 are constant 0)
        net[0].bias.zero_()
        net[2].weight.copy_(torch.tensor([[3.0, -1.0, 0.5, 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 1.0, 0.0, 0.0]]))
    return net.eval()


def test_top_units_rank_by_influence() -> None:
    x = torch.rand(10, 4) + 0.1  # positive: every ReLU is active
    top = top_units(_net(), "1", x, target=0, k=3)
    assert [u.unit for u in top][:2] == [0, 2]  # then a tie at 0 among units 3, 4, 5
    assert top[0].score == pytest.approx(3.0)
    assert top_units(_net(), "1", x, target=1, k=1)[0].unit == 1
    with pytest.raises(ConfigError):
        top_units(_net(), "1", x, target=0, k=0)


def test_unit_attribution_localises_the_unit() -> None:
    """Unit i of the hidden layer copies input i: its input attribution (IG from 0) is x_i on feature i only."""
    x = torch.rand(3, 4) + 0.1
    a = unit_attribution(_net(), "1", 2, x, "integrated_gradients", steps=16)
    expected = torch.zeros_like(x)
    expected[:, 2] = x[:, 2]
    assert torch.allclose(a, expected, atol=1e-6)
    with pytest.raises(ConfigError, match="out of range"):
        unit_attribution(_net(), "1", 9, x)


def test_unit_inversion_maximises_the_unit() -> None:
    net = _net()
    inv = unit_inversion(net, "1", [1, 3], (4,), steps=40, step_size=0.05, x0=0.5)
    assert inv.shape == (2, 4)
    assert inv[0, 1] == pytest.approx(1.0) and inv[1, 3] == pytest.approx(1.0)  # pushed to the box's top
    z = net[1](net[0](inv))
    assert z[0, 1] > 0.99 and z[1, 3] > 0.99


def test_compare_models_and_concentration() -> None:
    a, b = _net(), _net()
    with torch.no_grad():
        b[2].weight[0] = -b[2].weight[0]
    x = torch.rand(5, 4) + 0.1
    attrs, rows = compare_models({"a": a, "same": _net(), "flipped": b}, x, torch.zeros(5, dtype=torch.long),
                                 "integrated_gradients", steps=8)
    by = {(r["model_a"], r["model_b"]): r for r in rows}
    assert by[("a", "same")]["cosine"] == pytest.approx(1.0)
    assert by[("a", "flipped")]["cosine"] == pytest.approx(-1.0)
    c = concentration(torch.tensor([[1.0, 0, 0, 0, 0, 0, 0, 0, 0, 0], [1.0] * 10]))
    assert c.tolist() == pytest.approx([1.0, 0.1])
