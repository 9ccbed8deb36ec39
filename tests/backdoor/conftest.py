"""Fixtures of the backdoor tests: one clean and one backdoored digits model, trained once per session (small: a
CNN 8–16, fc 32, 300 steps; BadNets 2×2 on 10 % of the rows, target class 3)."""

from __future__ import annotations

import pytest
import torch

from modelward.backdoor.experiment import AttackSpec, BackdoorConfig, Trained, train_backdoored
from modelward.core.data import DataConfig, DataSplit, load_data
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig

SMALL = ModelConfig(arch="cnn", channels=[8, 16], fc=32)
QUICK = TrainConfig(steps=300, eval_every=300)
TARGET = 3


def small_config(attack: AttackSpec | None = None, seed: int = 0) -> BackdoorConfig:
    return BackdoorConfig(data=DataConfig(source="digits"), model=SMALL, train=QUICK, attack=attack, seed=seed)


@pytest.fixture(scope="session")
def digits() -> DataSplit:
    return load_data(DataConfig(source="digits"))


@pytest.fixture(scope="session")
def backdoored(digits: DataSplit) -> Trained:
    torch.set_num_threads(1)
    return train_backdoored(small_config(AttackSpec(name="badnets", target=TARGET, rate=0.1, params={"size": 2})),
                            digits)


@pytest.fixture(scope="session")
def clean(digits: DataSplit) -> Trained:
    torch.set_num_threads(1)
    return train_backdoored(small_config(), digits)
