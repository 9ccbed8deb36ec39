"""PGD under ℓ2: stays in the ball, beats random, and its random start covers the ball."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from modelward.robustness.attacks import make_attack
from modelward.robustness.attacks.base import predict

torch.set_num_threads(1)  # the CI box is shared; oversubscribed BLAS threads are 10-50x slower

TOL = 1e-5


def _rand_success(model: nn.Module, x: torch.Tensor, y: torch.Tensor, delta: torch.Tensor) -> float:
    return float((predict(model, (x + delta).clamp(0, 1)) != y).float().mean())


def _in_box(x_adv: torch.Tensor) -> bool:
    return bool(x_adv.min() >= 0.0) and bool(x_adv.max() <= 1.0)


def test_l2_pgd_respects_ball_and_beats_random(victim, batch):
    x, y = batch
    eps = 1.0
    res = make_attack("pgd", victim, eps=eps, norm="l2", steps=20)(x, y)
    assert (res.x_adv - x).flatten(1).norm(dim=1).max() <= eps + TOL
    assert _in_box(res.x_adv)
    g = torch.Generator().manual_seed(1)
    d = torch.randn(x.shape, generator=g)
    d = d / d.flatten(1).norm(dim=1).view(-1, 1, 1, 1) * eps
    assert res.success_rate > _rand_success(victim, x, y, d) + 0.3


def test_pgd_l2_random_start_covers_the_ball(victim):
    from modelward.robustness.attacks.pgd import PGD

    x = torch.full((4000, 1, 8, 8), 0.5)
    g = torch.Generator().manual_seed(0)
    r = (PGD(victim, eps=0.4, norm="l2")._start(x, g) - x).flatten(1).norm(dim=1)
    assert float(r.max()) <= 0.4 + 1e-6
    assert abs(float(r.mean()) - 0.2) < 0.01 and float((r < 0.2).float().mean()) == pytest.approx(0.5, abs=0.03)
    rv = (PGD(victim, eps=0.4, norm="l2", start_radius="volume")._start(x, g) - x).flatten(1).norm(dim=1)
    assert float((rv > 0.38).float().mean()) > 0.9  # uniform in volume: almost always at the sphere in d = 64
