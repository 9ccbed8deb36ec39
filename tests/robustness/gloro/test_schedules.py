"""GloRo ε / λ schedules."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from modelward.robustness.gloro import (
    GloroNet,
    Schedule,
    build_gloro_model,
    decay_to,
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


