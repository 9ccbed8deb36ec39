"""Targeted FGSM raises the target's probability."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

from modelward.robustness.attacks import make_attack
from modelward.robustness.attacks.base import predict

torch.set_num_threads(1)  # the CI box is shared; oversubscribed BLAS threads are 10-50x slower

EPS = 0.15
TOL = 1e-5


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    d = load_digits()
    return torch.tensor(d.data / 16, dtype=torch.float32).view(-1, 1, 8, 8), torch.tensor(d.target)


@pytest.fixture(scope="module")
def victim(digits) -> nn.Module:
    x, y = digits
    torch.manual_seed(0)
    m = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.Adam(m.parameters(), 1e-2)
    for _ in range(250):
        opt.zero_grad()
        F.cross_entropy(m(x[:1400]), y[:1400]).backward()
        opt.step()
    return m


@pytest.fixture(scope="module")
def batch(digits, victim) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = digits
    xs, ys = x[1400:], y[1400:]
    keep = predict(victim, xs) == ys  # attack only points the model gets right
    return xs[keep][:60], ys[keep][:60]


def _rand_success(model: nn.Module, x: torch.Tensor, y: torch.Tensor, delta: torch.Tensor) -> float:
    return float((predict(model, (x + delta).clamp(0, 1)) != y).float().mean())


def _in_box(x_adv: torch.Tensor) -> bool:
    return bool(x_adv.min() >= 0.0) and bool(x_adv.max() <= 1.0)


def test_targeted_fgsm_raises_target_probability(victim, batch):
    x, y = batch
    target = (y + 1) % 10
    res = make_attack("fgsm", victim, eps=0.1, targeted=True)(x, y, target)
    with torch.no_grad():
        before = F.softmax(victim(x), 1).gather(1, target[:, None])
        after = F.softmax(victim(res.x_adv), 1).gather(1, target[:, None])
    assert float((after > before).float().mean()) > 0.9


