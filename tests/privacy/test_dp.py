"""DP-SGD through Opacus: the reported ε equals Opacus' accountant for the noise / rate / steps used."""

from __future__ import annotations

import pytest
import torch

from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError
from modelward.privacy.dp import (
    DPConfig,
    add_dropout,
    check_advantage,
    epsilon_spent,
    noise_for_epsilon,
    train_dp,
)

pytest.importorskip("opacus")


def test_epsilon_of_fixed_noise_equals_opacus_accountant() -> None:
    from opacus.accountants import RDPAccountant

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(120, 6, generator=g), torch.randint(0, 2, (120,), generator=g)
    model = build_model(ModelConfig(arch="mlp", hidden=[8]), (6,), 2)
    rep = train_dp(model, x, y, DPConfig(noise_multiplier=1.1, epochs=2, batch_size=30, delta=1e-3), seed=0)
    acc = RDPAccountant()
    acc.history = [(1.1, 30 / 120, 8)]  # 2 epochs × 4 Poisson batches at rate 1/4
    assert rep.sample_rate == 0.25 and rep.steps == 8 and rep.accountant == "rdp"
    assert rep.epsilon == pytest.approx(acc.get_epsilon(1e-3), rel=1e-12)
    assert rep.epsilon == pytest.approx(epsilon_spent(1.1, 0.25, 8, 1e-3))
    assert "rdp accountant" in rep.text() and not model.training


def test_noise_for_target_epsilon_meets_the_target() -> None:
    sigma = noise_for_epsilon(1.0, 1e-4, 0.05, 3)
    eps = epsilon_spent(sigma, 0.05, 3 * 20, 1e-4)
    assert eps <= 1.0 and eps > 0.9
    assert epsilon_spent(0.9 * sigma, 0.05, 3 * 20, 1e-4) > 1.0  # less noise would overspend the budget


def test_dp_config_errors_and_advantage_check() -> None:
    model = build_model(ModelConfig(arch="mlp", hidden=[4]), (3,), 2)
    with pytest.raises(ConfigError, match="target_epsilon"):
        train_dp(model, torch.zeros(8, 3), torch.zeros(8, dtype=torch.long), DPConfig())
    chk = check_advantage(0.05, 400, 0.25, 1e-5)
    assert chk["within"] and not chk["violation"] and chk["bound_yeom"] == pytest.approx(0.284, abs=1e-3)
    assert check_advantage(0.9, 4000, 0.25, 1e-5)["violation"]


def test_dropout_hooks_act_only_in_training_mode() -> None:
    torch.manual_seed(0)
    model = add_dropout(build_model(ModelConfig(arch="mlp", hidden=[64]), (5,), 2), 0.5)
    x = torch.randn(4, 5)
    model.eval()
    assert torch.equal(model(x), model(x))
    model.train()
    assert not torch.equal(model(x), model(x))
