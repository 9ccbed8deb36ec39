"""PGD adversarial training and TRADES raise robust accuracy over clean training."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from modelward.core.train import TrainConfig, train
from modelward.robustness.metrics import robust_accuracy
from modelward.robustness.training import AdversarialConfig, pgd_adversarial_training, trades_training

torch.set_num_threads(1)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


CFG = TrainConfig(optimizer="adam", lr=2e-3, weight_decay=0.0, steps=250, batch_size=64, eval_every=125)
ADV = AdversarialConfig(eps=0.1, attack_steps=5)


def _robust(model, x, y) -> float:
    return robust_accuracy(model, x, y, "pgd", [0.1], {"steps": 10})[0].robust_accuracy


@pytest.fixture(scope="module")
def clean_robust(digits) -> float:
    xtr, ytr, xte, yte = digits
    m = _mlp()
    train(m, xtr, ytr, xte, yte, CFG, 0)
    return _robust(m, xte, yte)


def test_pgd_adversarial_training_improves_robustness(digits, clean_robust):
    xtr, ytr, xte, yte = digits
    m = _mlp()
    steps = []
    res = pgd_adversarial_training(m, xtr, ytr, CFG, ADV, seed=0, x_test=xte, y_test=yte,
                                   on_step=lambda s, loss: steps.append(s))
    assert steps == list(range(1, CFG.steps + 1)) and res.steps_run == CFG.steps
    assert [s for s, _ in res.test_error] == [125, 250] and res.test_error[-1][1] < 0.25
    assert 0.3 < res.adv_train_accuracy <= 1.0
    assert m.training and all(p.requires_grad for p in m.parameters())
    assert _robust(m, xte, yte) > clean_robust + 0.1


def test_trades_improves_robustness(digits, clean_robust):
    xtr, ytr, xte, yte = digits
    m = _mlp()
    trades_training(m, xtr, ytr, CFG, ADV, seed=0)
    assert _robust(m, xte, yte) > clean_robust + 0.1
