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
