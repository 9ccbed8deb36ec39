"""GloRo losses."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from modelward.robustness.gloro import (
    gloro_cross_entropy,
    gloro_trades_loss,
)

torch.set_num_threads(1)


def test_losses() -> None:
    logits = torch.tensor([[2.0, 0.0, -1.0]])  # values only: no graph (a float() of one would warn)
    gl = torch.cat([logits, torch.tensor([[1.0]])], 1)
    y = torch.tensor([0])
    assert float(gloro_cross_entropy(gl, y)) == pytest.approx(float(nn.functional.cross_entropy(gl, y)))
    # λ = 0 reduces TRADES to plain CE; a larger ⊥ logit increases the robust term
    assert float(gloro_trades_loss(logits, gl, y, 0.0)) == pytest.approx(float(nn.functional.cross_entropy(logits, y)))
    hi = torch.cat([logits, torch.tensor([[5.0]])], 1)
    assert gloro_trades_loss(logits, hi, y, 1.0) > gloro_trades_loss(logits, gl, y, 1.0)
    assert gloro_trades_loss(logits, hi, y, 1.0, "ce") > gloro_trades_loss(logits, gl, y, 1.0, "ce")


