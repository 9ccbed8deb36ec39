"""Fixtures shared by the robustness tests."""

from __future__ import annotations

import pytest
import torch
from sklearn.datasets import load_digits


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, ...]:
    """Digits as 1×8×8 images in [0, 1]: 1,400 training and 397 test points."""
    d = load_digits()
    x = torch.tensor(d.data / 16, dtype=torch.float32).view(-1, 1, 8, 8)
    y = torch.tensor(d.target)
    return x[:1400], y[:1400], x[1400:], y[1400:]


@pytest.fixture(scope="session")
def digits_xy() -> tuple[torch.Tensor, torch.Tensor]:
    """All of digits as 1×8×8 images in [0, 1] with labels (the attack tests' victim trains on the first 1,400)."""
    d = load_digits()
    return torch.tensor(d.data / 16, dtype=torch.float32).view(-1, 1, 8, 8), torch.tensor(d.target)


@pytest.fixture(scope="session")
def victim(digits_xy: tuple[torch.Tensor, torch.Tensor]) -> torch.nn.Module:
    """A small MLP trained on digits: what the evasion attacks attack."""
    import torch.nn.functional as F
    from torch import nn

    x, y = digits_xy
    torch.manual_seed(0)
    m = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.Adam(m.parameters(), 1e-2)
    for _ in range(250):
        opt.zero_grad()
        F.cross_entropy(m(x[:1400]), y[:1400]).backward()
        opt.step()
    return m


@pytest.fixture(scope="session")
def batch(digits_xy: tuple[torch.Tensor, torch.Tensor], victim: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """60 held-out points the victim classifies correctly (attacks only start from correct points)."""
    from modelward.robustness.attacks.base import predict

    x, y = digits_xy
    xs, ys = x[1400:], y[1400:]
    keep = predict(victim, xs) == ys
    return xs[keep][:60], ys[keep][:60]
