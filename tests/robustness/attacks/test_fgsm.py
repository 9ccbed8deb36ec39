"""Targeted FGSM raises the target's probability."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from modelward.robustness.attacks import make_attack

torch.set_num_threads(1)  # the CI box is shared; oversubscribed BLAS threads are 10-50x slower


def test_targeted_fgsm_raises_target_probability(victim, batch):
    x, y = batch
    target = (y + 1) % 10
    res = make_attack("fgsm", victim, eps=0.1, targeted=True)(x, y, target)
    with torch.no_grad():
        before = F.softmax(victim(x), 1).gather(1, target[:, None])
        after = F.softmax(victim(res.x_adv), 1).gather(1, target[:, None])
    assert float((after > before).float().mean()) > 0.9


