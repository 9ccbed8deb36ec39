"""GloRo losses."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from modelward.robustness.gloro import (
    GloroNet,
    build_gloro_model,
    gloro_cross_entropy,
    gloro_trades_loss,
)

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
def _conv_net(seed: int = 0) -> nn.Sequential:
    return build_gloro_model("c(8,3,1).c(8,4,2).d(16)", (1, 8, 8), 4, seed=seed)


def _images(n: int = 200, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, 8, 8, generator=g)
    return x, torch.randint(4, (n,), generator=g)


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


