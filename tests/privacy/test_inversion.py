"""Model inversion (Eq. 8.1) recovers the known optimum of a logistic model in the [0, 1] box."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from modelward.errors import ConfigError
from modelward.privacy.inversion import invert


def _logistic(w: torch.Tensor, b: float = 0.0) -> nn.Module:
    # two-class softmax with logits (0, wᵀx + b) = a logistic model on class 1
    lin = nn.Linear(len(w), 2)
    with torch.no_grad():
        lin.weight.copy_(torch.stack([torch.zeros_like(w), w]))
        lin.bias.copy_(torch.tensor([0.0, b]))
    return lin


def test_inversion_reaches_box_corner_of_logistic_model() -> None:
    w = torch.tensor([1.5, -2.0, 0.7, -0.3, 2.2, -1.1])
    model = _logistic(w)
    # min CE(class 1) over [0,1]^n = maximise wᵀx: x_i = 1 where w_i > 0, else 0; class 0 the opposite corner
    res = invert(model, [1, 0], x0=0.5, input_shape=(6,), steps=200, step_size=0.05)
    assert torch.equal(res.x[0], (w > 0).float())
    assert torch.equal(res.x[1], (w < 0).float())
    best = torch.sigmoid(w.clamp(min=0).sum())  # the optimum's confidence: σ(max_x wᵀx)
    assert torch.isclose(res.confidence[0], best, atol=1e-6)


def test_inversion_l2_steps_move_exactly_step_size_without_box() -> None:
    model = _logistic(torch.tensor([3.0, 4.0]))
    res = invert(model, [1], x0=torch.zeros(2), input_shape=(2,), steps=10, step_size=0.1, box=None)
    # the gradient direction is constant (w/‖w‖): 10 steps of length 0.1 along it
    assert torch.allclose(res.x[0], torch.tensor([0.6, 0.8]), atol=1e-5)


def test_inversion_rejects_bad_arguments_and_leaves_model_untouched() -> None:
    model = _logistic(torch.tensor([1.0, 1.0]))
    model.train()
    with pytest.raises(ConfigError, match="valid choices"):
        invert(model, [1], x0=0.0, input_shape=(2,), loss="mse")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="input_shape"):
        invert(model, [1], x0=0.0)
    invert(model, [1], x0=0.0, input_shape=(2,), steps=2)
    assert model.training and all(p.requires_grad for p in model.parameters())
