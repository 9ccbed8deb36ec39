"""Helpers shared by the GloRo tests, as fixtures: small blob data, a small GloRo MLP, an ε that certifies a share."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from modelward.robustness.gloro import GloroNet, build_gloro_model


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


@pytest.fixture
def blobs() -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    return _blobs


@pytest.fixture
def gloro_mlp() -> Callable[..., nn.Sequential]:
    return _mlp


@pytest.fixture
def eps_for() -> Callable[..., float]:
    return _eps_for
