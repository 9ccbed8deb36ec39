"""L-BFGS finds the minimum-norm direction of a linear model."""

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


def test_lbfgs_finds_minimum_norm_direction_on_linear_model():
    torch.manual_seed(0)
    lin = nn.Linear(10, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(2, 10))
        lin.bias.zero_()
    x = torch.rand(8, 10) * 0.2 + 0.4
    y = predict(lin, x)
    w = (lin.weight[1] - lin.weight[0]).detach()  # logit margin of class 1 over class 0 is w·x + b
    with torch.no_grad():
        margin = x @ w + (lin.bias[1] - lin.bias[0])
    r_star = -margin[:, None] * w[None] / w.dot(w)  # analytic minimum-norm perturbation to the boundary
    res = make_attack("lbfgs", lin, clip=(-10.0, 10.0), binary_steps=12, max_iter=100)(x, y)
    r = res.x_adv - x
    assert bool(res.success.all())
    cos = F.cosine_similarity(r, r_star, dim=1)
    assert float(cos.min()) > 0.999
    ratio = r.norm(dim=1) / r_star.norm(dim=1)
    assert float(ratio.min()) >= 1.0 - 1e-4 and float(ratio.max()) < 1.1


