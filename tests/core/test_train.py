"""Training procedure T (curve semantics, T2 freezing), the run ledger, safetensors io."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from modelward.core.data import load_data
from modelward.core.parts import reset_part_, resolve_part
from modelward.core.train import Checkpointing, TrainConfig, train
from modelward.core.zoo import ModelConfig, build_model

CFG = TrainConfig(steps=30, eval_every=10, batch_size=32, lr=0.05)


def _setup():
    d = load_data()
    torch.manual_seed(0)
    m = build_model(ModelConfig(arch="cnn", channels=[4, 8], fc=16), d.input_shape, d.num_classes)
    return d, m


def test_curve_starts_at_step_zero_and_is_deterministic():
    d, m = _setup()
    m2 = build_model(ModelConfig(arch="cnn", channels=[4, 8], fc=16), d.input_shape, d.num_classes)
    m2.load_state_dict(m.state_dict())
    r1 = train(m, d.x_train, d.y_train, d.x_test, d.y_test, CFG, seed=3)
    r2 = train(m2, d.x_train, d.y_train, d.x_test, d.y_test, CFG, seed=3)
    assert [s for s, _ in r1.curve] == [0, 10, 20, 30]
    assert r1.curve == r2.curve
    assert r1.curve[-1][1] < r1.curve[0][1]  # it learned something


def test_early_stop_at_threshold():
    d, m = _setup()
    r = train(m, d.x_train, d.y_train, d.x_test, d.y_test, CFG.model_copy(update={"steps": 200}), 0, stop_at=0.6)
    assert r.stopped_early and r.curve[-1][1] <= 0.6 and r.steps_run < 200


def test_t2_leaves_everything_else_bit_identical():
    d, m = _setup()
    train(m, d.x_train, d.y_train, d.x_test, d.y_test, CFG, 0)
    part = reset_part_(m, "conv2", "glorot_uniform", torch.Generator().manual_seed(1))
    before = {k: v.clone() for k, v in m.state_dict().items()}
    train(m, d.x_train, d.y_train, d.x_test, d.y_test, CFG, 1, trainable=set(part.params))
    after = m.state_dict()
    inside = set(part.params) | set(part.buffers)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and changed <= inside
    assert "conv2.0.conv.weight" in changed and resolve_part(m, "conv2").params


def test_lr_schedule_piecewise():
    cfg = TrainConfig(lr=0.1, lr_schedule=[(0, 0.1), (10, 0.01), (20, 0.001)])
    assert [cfg.lr_at(s) for s in (0, 9, 10, 25)] == [0.1, 0.1, 0.01, 0.001]




def _model(seed: int = 0) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    m = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.2),
                      nn.Linear(32, 10))
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return m


class Crash(Exception):
    pass


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_resume_after_crash_is_bit_identical(tmp_path: Path, optimizer: str) -> None:
    d = load_data()
    cfg = TrainConfig(optimizer=optimizer, steps=45, eval_every=10, batch_size=32, lr=0.05 if optimizer == "sgd" else 1e-3)
    torch.manual_seed(123)
    ref_model = _model()
    ref = train(ref_model, d.x_train, d.y_train, d.x_test, d.y_test, cfg, seed=4)

    ck = Checkpointing(tmp_path / "run.ckpt.safetensors", every=7)

    def crash(step: int, _val: float) -> None:
        if step == 30:
            raise Crash

    torch.manual_seed(123)
    with pytest.raises(Crash):
        train(_model(), d.x_train, d.y_train, d.x_test, d.y_test, cfg, seed=4, checkpoint=ck, on_eval=crash)
    assert ck.path.is_file()
    torch.manual_seed(999)  # the global RNG is restored from the checkpoint, not from here
    resumed_model = _model()
    resumed = train(resumed_model, d.x_train, d.y_train, d.x_test, d.y_test, cfg, seed=4, checkpoint=ck)
    assert resumed.curve == ref.curve
    assert resumed.train_loss == ref.train_loss
    for (n, a), b in zip(ref_model.state_dict().items(), resumed_model.state_dict().values(), strict=True):
        assert torch.equal(a, b), n


def test_a_finished_checkpoint_is_not_trained_again(tmp_path: Path) -> None:
    d = load_data()
    cfg = TrainConfig(steps=20, eval_every=10, batch_size=32)
    ck = Checkpointing(tmp_path / "c.safetensors", every=5)
    first = train(_model(), d.x_train, d.y_train, d.x_test, d.y_test, cfg, seed=1, checkpoint=ck)
    again = train(_model(), d.x_train, d.y_train, d.x_test, d.y_test, cfg, seed=1, checkpoint=ck)
    assert again.curve == first.curve and again.steps_run == 20


def test_dataset_inputs_train_like_tensors() -> None:
    d = load_data()
    cfg = TrainConfig(steps=20, eval_every=10, batch_size=32)
    torch.manual_seed(0)
    a = train(_model(), d.x_train, d.y_train, d.x_test, d.y_test, cfg, seed=2)
    torch.manual_seed(0)
    b = train(_model(), TensorDataset(d.x_train, d.y_train), None, TensorDataset(d.x_test, d.y_test), None, cfg,
              seed=2)
    assert a.curve == b.curve


def test_loader_workers_decode_the_same_batches(tmp_path: Path) -> None:
    d = load_data()
    cfg = TrainConfig(steps=20, eval_every=10, batch_size=32)
    train_set, test_set = TensorDataset(d.x_train, d.y_train), TensorDataset(d.x_test, d.y_test)
    torch.manual_seed(0)
    a = train(_model(), train_set, None, test_set, None, cfg, seed=2)
    torch.manual_seed(0)
    b = train(_model(), train_set, None, test_set, None, cfg, seed=2, workers=1)
    assert a.curve == b.curve
