"""Retraining procedures T1–T4 through the supervised problem."""

from __future__ import annotations

import torch

from modelward.completion.problem import ProcedureSpec
from modelward.completion.procedures import prepare_retraining
from modelward.completion.supervised import SupervisedProblem
from modelward.core.data import DataConfig
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig


def _problem() -> SupervisedProblem:
    return SupervisedProblem(DataConfig(source="iris"), ModelConfig(arch="mlp", hidden=[8]),
                             TrainConfig(steps=40, eval_every=10, batch_size=16, lr=0.05))


def test_t2_returns_only_the_part_and_t3_overparametrises(tmp_path):
    p = _problem()
    m = p.build()
    g = torch.Generator().manual_seed(0)
    assert prepare_retraining(m, "fc1", ProcedureSpec(name="a", kind="T2"), g) == {"fc1.weight", "fc1.bias"}
    assert prepare_retraining(m, "fc1", ProcedureSpec(name="b", kind="T1"), g) is None
    m3 = p.build()
    prepare_retraining(m3, "fc1", ProcedureSpec(name="c", kind="T3", t3_factor=3.0), g)
    assert isinstance(m3.fc1, torch.nn.Sequential) and m3.fc1[0].out_features == 24
    assert m3(torch.rand(2, 4)).shape == (2, 3)


def test_retrain_curves_for_every_procedure(tmp_path):
    p = _problem()
    orig = p.train_original(0, "", tmp_path)
    n_test = len(p.splits()[2])  # L is measured on the validation split
    assert [c for c, _ in orig.curve] == [0, 10, 20, 30, 40] and orig.best < orig.loss0
    curves = {}
    for spec in [ProcedureSpec(name="T1", kind="T1"), ProcedureSpec(name="T2", kind="T2"),
                 ProcedureSpec(name="T3", kind="T3", t3_variant="wider"),
                 ProcedureSpec(name="T4", kind="T4", init="caffe")]:
        curve = curves[spec.name] = p.retrain(orig, "fc1", spec, 0, budget=40, stop_at=None, workdir=tmp_path)
        assert [c for c, _ in curve] == [0, 10, 20, 30, 40], spec.name  # an evaluation every eval_every steps
        losses = [v for _, v in curve]
        assert all(abs(v * n_test - round(v * n_test)) < 1e-9 for v in losses), losses  # test error rates
        assert losses[0] > orig.best, spec.name  # resetting fc1 hurts the trained model ...
        assert min(losses[1:]) < losses[0], spec.name  # ... and retraining recovers
    # T1 and T2 reset fc1 to the same draw (paired init seeds), then train different parameter sets
    assert curves["T1"][0] == curves["T2"][0] and curves["T1"] != curves["T2"]
    # early stop: a loose threshold is met right away
    short = p.retrain(orig, "logits", ProcedureSpec(name="T1", kind="T1"), 0, budget=40, stop_at=1.0,
                      workdir=tmp_path)
    assert short == short[:1]


def test_t0_reinitialises_every_parameter_and_seeds_are_paired():
    from modelward.completion.procedures import paired_seeds

    p = _problem()
    m = p.build()
    with torch.no_grad():
        for q in m.parameters():
            q.fill_(0.123)
    assert prepare_retraining(m, "ignored", ProcedureSpec(name="T0", kind="T0"), torch.Generator()) is None
    assert all(not torch.all(q == 0.123) for q in m.parameters())  # weights re-drawn, biases zeroed
    # the training seed is shared by every part and procedure of a retraining seed, the init seed by every
    # procedure resetting the same part
    assert paired_seeds(3, "", "fc1")[0] == paired_seeds(3, "", "logits")[0] != paired_seeds(4, "", "fc1")[0]
    assert paired_seeds(3, "", "fc1")[1] != paired_seeds(3, "", "logits")[1]
