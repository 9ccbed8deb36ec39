"""bayesian-wb (Alg. 8.1), the deep attack (Alg. 8.3) and nn-wb on tiny models with known answers."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig, build_model
from modelward.privacy.membership import AttackData, make_membership_attack
from modelward.privacy.shadows import ModelTrainer


def _data(n: int = 240, d: int = 5, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    y = (x[:, 0] + 0.5 * torch.randn(n, generator=g) > 0).long()
    return x, y


def test_memorised_training_set_is_separated_perfectly() -> None:
    from modelward.privacy import metrics

    g = torch.Generator().manual_seed(0)
    x = torch.randn(80, 10, generator=g)
    y = torch.randint(0, 4, (80,), generator=g)  # random labels: only memorisation fits the members
    trainer = ModelTrainer(lambda: build_model(ModelConfig(arch="mlp", hidden=[128]), (10,), 4),
                           TrainConfig(optimizer="adam", lr=1e-2, batch_size=40, steps=400, weight_decay=0.0))
    target = trainer.train(x[:40], y[:40], seed=0)
    data = AttackData(target, x[40:], y[40:], 4, trainer)
    members = np.r_[np.ones(20, bool), np.zeros(20, bool)]
    xe, ye = torch.cat([x[:20], x[60:]]), torch.cat([y[:20], y[60:]])
    scores = make_membership_attack("loss", tau=0.05).fit(data).score(xe, ye)
    m = metrics.evaluate(scores, members, -0.05)
    assert m.auc == 1.0 and m.tpr_at_0_1pct_fpr == 1.0  # every member scores above every non-member
    assert m.tpr == 1.0  # and all members are below the loss threshold


def test_nn_wb_min_capacity_trains_and_scores() -> None:
    x, y = _data(n=200, seed=4)
    trainer = ModelTrainer(lambda: nn.Linear(5, 2), TrainConfig(lr=0.1, batch_size=32, steps=40))
    target = trainer.train(x[:50], y[:50], seed=1)
    a = make_membership_attack("nn_wb", splits=2, hidden=0, epochs=4).fit(AttackData(target, x[100:], y[100:], 2, trainer))
    s = a.score(x[:20], y[:20])
    assert s.shape == (20,) and np.isfinite(s).all()
    assert a.w.shape == (2, 5) and a.b.shape == (2,)
