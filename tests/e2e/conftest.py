"""Shared checks of the end-to-end tests."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch


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
