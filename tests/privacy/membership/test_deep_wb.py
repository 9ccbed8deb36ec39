"""bayesian-wb (Alg. 8.1), the deep attack (Alg. 8.3) and nn-wb on tiny models with known answers."""

from __future__ import annotations

import numpy as np
import torch

from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig, build_model
from modelward.privacy.membership import AttackData
from modelward.privacy.membership.bayesian_wb import BayesianWB
from modelward.privacy.membership.deep_wb import DeepWB, influence
from modelward.privacy.shadows import ModelTrainer
from modelward.privacy.slicing import Top, features


def _data(n: int = 240, d: int = 5, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    y = (x[:, 0] + 0.5 * torch.randn(n, generator=g) > 0).long()
    return x, y


def test_integrated_gradients_completeness_eq_8_12_on_a_nonlinear_top() -> None:
    torch.manual_seed(0)
    net = build_model(ModelConfig(arch="mlp", hidden=[8, 6]), (4,), 3)
    x = torch.randn(16, 4)
    y = torch.randint(0, 3, (16,))
    top = Top.of(net, "fc2", x, side="input")  # g = relu∘fc2 → relu → logits (nonlinear)
    z = features(net, "fc2", x, "input")
    chi = influence(top, z, y, steps=256)
    with torch.no_grad():
        lhs = (chi * z).sum(1) + top(torch.zeros_like(z)).gather(1, y[:, None])[:, 0]
        rhs = top(z).gather(1, y[:, None])[:, 0]
        direct = net(x).gather(1, y[:, None])[:, 0]
    assert torch.allclose(rhs, direct, atol=1e-5)  # the slice reproduces the network
    assert torch.allclose(lhs, rhs, atol=2e-3)  # χᵀz + g(0) = g(z)


def test_deep_wb_on_the_last_linear_slice_equals_bayesian_wb() -> None:
    x, y = _data(seed=2)
    trainer = ModelTrainer(lambda: build_model(ModelConfig(arch="mlp", hidden=[8]), (5,), 2),
                           TrainConfig(lr=0.1, batch_size=32, steps=60))
    target = trainer.train(x[:60], y[:60], seed=1)
    data = AttackData(target, x[120:], y[120:], 2, trainer, seed=0)
    deep = DeepWB(slices=[("logits", "input")], proxies=3, ig_steps=4).fit(data)
    bwb = BayesianWB(proxies=3).fit(AttackData(target, x[120:], y[120:], 2, trainer, seed=0))
    # a linear top: IG is exact for any step count, so the two attacks coincide
    np.testing.assert_allclose(deep.score(x[:40], y[:40]), bwb.score(x[:40], y[:40]), atol=1e-5)
