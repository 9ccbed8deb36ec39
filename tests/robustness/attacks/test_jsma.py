"""JSMA respects its ℓ0 budget and beats random."""

from __future__ import annotations

import torch

from modelward.robustness.attacks import make_attack
from modelward.robustness.attacks.base import predict

torch.set_num_threads(1)  # the CI box is shared; oversubscribed BLAS threads are 10-50x slower


def _in_box(x_adv: torch.Tensor) -> bool:
    return bool(x_adv.min() >= 0.0) and bool(x_adv.max() <= 1.0)


def test_jsma_respects_l0_budget_and_beats_random(victim, batch):
    x, y = batch
    atk = make_attack("jsma", victim, gamma=0.1)
    res = atk(x, y)
    changed = ((res.x_adv - x).abs() > 0).flatten(1).sum(1)
    assert int(changed.max()) <= atk.max_features(x) == 6
    assert _in_box(res.x_adv)
    g = torch.Generator().manual_seed(3)
    idx = torch.rand(len(x), 64, generator=g).argsort(1)[:, :6]
    rand = x.flatten(1).clone()
    rand.scatter_(1, idx, 1.0)
    rand_success = float((predict(victim, rand.view_as(x)) != y).float().mean())
    assert res.success_rate > rand_success + 0.3


