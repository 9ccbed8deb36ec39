"""Training procedure T (curve semantics, T2 freezing), the run ledger, safetensors io."""

from __future__ import annotations

import torch

from modelward.core.data import load_data
from modelward.core.parts import reset_part_, resolve_part
from modelward.core.train import TrainConfig, train
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
