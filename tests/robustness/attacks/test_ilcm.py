"""ILCM reaches the least-likely class."""

from __future__ import annotations

import torch

from modelward.robustness.attacks import make_attack
from modelward.robustness.attacks.base import predict

torch.set_num_threads(1)  # the CI box is shared; oversubscribed BLAS threads are 10-50x slower

TOL = 1e-5


def test_ilcm_reaches_least_likely_class(victim, batch):
    x, y = batch
    with torch.no_grad():
        least = victim(x).argmin(1)
    atk = make_attack("ilcm", victim, eps=0.3, steps=20)
    assert torch.equal(atk.default_target(x, y), least)
    res = atk(x, y)
    assert (res.x_adv - x).abs().max() <= 0.3 + TOL
    assert torch.equal(res.success, predict(victim, res.x_adv) == least)
    assert res.success_rate > 0.3


