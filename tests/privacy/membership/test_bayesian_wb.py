"""bayesian-wb (Alg. 8.1), the deep attack (Alg. 8.3) and nn-wb on tiny models with known answers."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from modelward.core.train import TrainConfig
from modelward.privacy.membership import AttackData
from modelward.privacy.membership.bayesian_wb import BayesianWB
from modelward.privacy.shadows import ModelTrainer


def _data(n: int = 240, d: int = 5, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    y = (x[:, 0] + 0.5 * torch.randn(n, generator=g) > 0).long()
    return x, y


def test_bayesian_wb_on_a_linear_model_is_the_weight_difference_of_alg_8_1() -> None:
    x, y = _data()
    cfg = TrainConfig(lr=0.1, batch_size=32, steps=60)
    trainer = ModelTrainer(lambda: nn.Linear(5, 2), cfg)
    target = trainer.train(x[:60], y[:60], seed=1)
    data = AttackData(target, x[120:], y[120:], 2, trainer, seed=3)
    attack = BayesianWB(proxies=3).fit(data)
    proxies = data.cache["proxies::3:True"]  # a bare nn.Linear: the slice is the model itself ("")
    W_til = torch.stack([p.model.weight.detach() for p in proxies]).double().mean(0)
    b_til = torch.stack([p.model.bias.detach() for p in proxies]).double().mean(0)
    np.testing.assert_allclose(attack.w, (target.weight.detach().double() - W_til).numpy(), atol=1e-6)
    np.testing.assert_allclose(attack.b, (target.bias.detach().double() - b_til).numpy(), atol=1e-6)
    # score = w^yᵀx + b^y; threshold 0 ⇔ σ(·) > ½
    xe, ye = x[:10], y[:10]
    expect = (attack.w[ye.numpy()] * xe.double().numpy()).sum(1) + attack.b[ye.numpy()]
    np.testing.assert_allclose(attack.score(xe, ye), expect, atol=1e-9)
    # the proxies were trained with A on the hold-out: each differs from the target
    assert all(not torch.allclose(p.model.weight, target.weight) for p in proxies)
