"""bayesian-wb (Alg. 8.1), the deep attack (Alg. 8.3) and nn-wb on tiny models with known answers."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig, build_model
from modelward.privacy.membership import AttackData, make_membership_attack
from modelward.privacy.membership.bayesian_wb import BayesianWB
from modelward.privacy.membership.deep_wb import DeepWB, influence
from modelward.privacy.shadows import ModelTrainer
from modelward.privacy.slicing import Top, features


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
