"""Shared checks of the end-to-end tests."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from modelward.core.config import to_toml

EX = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="session")
def exact_policy() -> Callable[..., str]:
    """``exact_policy(root, name="bob")``: see :func:`_exact_policy`."""
    return _exact_policy


def _exact_policy(root: Path, name: str = "bob") -> str:
    """A ``policy_file=…`` override for `name`: a copy of its shipped policy whose metrics and training losses leave
    exact (``eval.noise`` and ``train_loss.noise`` 0, the owner's opt-out), for runs compared bit for bit with
    monolithic training (as ``label_protection.method=none`` opts out of the gradient's noise)."""
    policy = tomllib.loads((EX / f"policy_{name}.toml").read_text())
    for table in ("eval", "train_loss"):
        policy.setdefault(table, {})["noise"] = 0.0
    path = Path(root) / f"policy_{name}_exact.toml"
    path.write_text(to_toml(policy))
    return f"policy_file={path}"


@pytest.fixture()
def assert_split_equals_monolithic() -> Callable[[Path, int, int], None]:
    """Check a finished split run of the demo CNN on digits (parties' newest checkpoints under ``root/<party>/ckpt``,
    the driver's ``root/driver/curve.json``) against monolithic training with the same seed and recipe."""

    def check(root: Path, steps: int, eval_every: int) -> None:
        from modelward.core.data import DataConfig, load_data
        from modelward.core.init import init_model_
        from modelward.core.io import load_tensors
        from modelward.core.train import TrainConfig, train
        from modelward.core.zoo import ModelConfig, build_model

        exports = {}
        for p in ("alice", "bob"):
            ck = sorted((root / p / "ckpt").glob("step_*.safetensors"))[-1]
            exports.update({k[6:]: v for k, v in load_tensors(ck).items() if k.startswith("model.")})
        data = load_data(DataConfig(source="digits", seed=0))
        model = init_model_(build_model(ModelConfig(arch="cnn", channels=[16, 32], fc=64), (1, 8, 8), 10),
                            "glorot_uniform", 0)
        tc = TrainConfig(optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=1e-4, batch_size=64, steps=steps,
                         eval_every=eval_every, loss="error")
        res = train(model, data.x_train, data.y_train, data.x_test, data.y_test, tc, seed=0)
        # equal to float32 rounding, not bit for bit: the parties are other processes (their own thread counts)
        # and each computes its part of the backward pass separately, so a step's sums may round differently; the
        # differences stay in the last digits of float32 over these short runs
        for k, v in model.state_dict().items():
            torch.testing.assert_close(exports[k].to(v.dtype), v, atol=1e-5, rtol=1e-5, msg=k)
        assert [tuple(c) for c in json.loads((root / "driver/curve.json").read_text())] == res.curve

    return check
