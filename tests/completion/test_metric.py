"""MC-hardness metric on hand-made curves with exact expected values."""

from __future__ import annotations

import math

import pytest

from modelward.completion.metric import Thresholds, first_reach, hardness_ratio
from modelward.core.stats import summarize

ORIG = [(0, 0.9), (10, 0.5), (20, 0.3), (30, 0.1), (40, 0.12), (50, 0.1)]


def test_thresholds_and_costs():
    t = Thresholds.from_curve(ORIG, [0.5, 1.0])
    assert t.loss0 == 0.9 and t.best == 0.1
    assert t.values[1.0] == pytest.approx(0.1) and t.values[0.5] == pytest.approx(0.5)
    assert t.costs == {0.5: 10, 1.0: 30}  # the first step with L ≤ ℓ, not the last


def test_ratio_reached_not_reached_and_step_zero():
    t = Thresholds.from_curve(ORIG, [0.5, 1.0])
    re = [(0, 0.8), (5, 0.45), (12, 0.1)]
    r1 = hardness_ratio(re, t.values[1.0], t.costs[1.0])
    assert (r1.value, r1.reached, r1.retrain_cost) == (pytest.approx(12 / 30), True, 12)
    assert hardness_ratio(re, t.values[0.5], t.costs[0.5]).value == pytest.approx(0.5)
    never = hardness_ratio([(0, 0.8), (30, 0.2)], t.values[1.0], t.costs[1.0])
    assert (never.value, never.reached) == (1.0, False)
    # threshold already met at step 0 of retraining: no retraining needed
    zero = hardness_ratio([(0, 0.05)], t.values[1.0], t.costs[1.0])
    assert (zero.value, zero.reached, zero.retrain_cost) == (0.0, True, 0)
    # slower than the original: capped at 1 (retraining from scratch is always allowed)
    slow = hardness_ratio([(0, 0.9), (45, 0.1)], t.values[1.0], t.costs[1.0])
    assert (slow.value, slow.capped) == (1.0, True)


def test_degenerate_original_cost_zero():
    t = Thresholds.from_curve([(0, 0.5), (10, 0.5)], [0.0, 1.0])
    assert t.costs == {0.0: 0, 1.0: 0} and not t.learned
    assert hardness_ratio([(0, 0.4)], t.values[1.0], 0).value == 0.0
    assert hardness_ratio([(0, 0.7), (5, 0.5)], t.values[1.0], 0).degenerate


def test_sd_convention_is_sample_sd():
    s = summarize([0.38, 0.39, 1.00])  # AlexNet Conv 1, T1, α=1 (App. C)
    assert s.mean == pytest.approx(0.59) and s.sd == pytest.approx(0.355, abs=5e-4)
    assert s.median == 0.39 and (s.min, s.max, s.n) == (0.38, 1.0, 3)
    assert summarize([0.34, 0.37, 1.00]).sd == pytest.approx(0.373, abs=5e-4)
    assert math.isnan(summarize([0.5]).sd)  # a single seed has no sample SD


def test_first_reach_and_curve_validation():
    assert first_reach(ORIG, 0.3) == 20 and first_reach(ORIG, 0.0) is None
    with pytest.raises(ValueError):
        Thresholds.from_curve([(5, 0.3)], [1.0])


def test_smoothed_threshold_and_uncapped_ratio():
    from modelward.completion.metric import Thresholds, hardness_ratio, trailing_mean

    curve = [(0, 1.0), (10, 0.2), (20, 0.6), (30, 0.5)]
    assert Thresholds.from_curve(curve, [1.0]).best == 0.2  # one lucky evaluation
    smooth = Thresholds.from_curve(curve, [1.0, 0.5], smoothing=2)  # trailing means 1, .6, .4, .55
    assert smooth.best == pytest.approx(0.4) and smooth.costs[1.0] == 10 and smooth.evals == {1.0: 1, 0.5: 1}
    assert trailing_mean(curve, 1) == curve
    r = hardness_ratio([(0, 1.0), (30, 0.35)], 0.4, 20)
    assert (r.value, r.raw, r.capped, r.reached) == (1.0, 1.5, True, True)
    nr = hardness_ratio([(0, 1.0), (50, 0.9)], 0.4, 20, budget=60)
    assert (nr.value, nr.raw, nr.reached) == (1.0, 3.0, False)  # not reached: budget / C, a lower bound


def test_validation_split_holds_out_and_test_reports(tmp_path):
    from modelward.completion.problem import ProcedureSpec
    from modelward.completion.supervised import SupervisedProblem
    from modelward.core.data import DataConfig
    from modelward.core.train import TrainConfig
    from modelward.core.zoo import ModelConfig

    args = (DataConfig(source="iris"), ModelConfig(arch="mlp", hidden=[8]),
            TrainConfig(steps=30, eval_every=10, batch_size=16, lr=0.05))
    p = SupervisedProblem(*args, retrain_lr_schedule=[[0, 1e-9]])
    x_fit, _, x_val, _ = p.splits()
    n = len(p.data.x_train)
    assert len(x_val) == round(0.2 * n) and len(x_fit) + len(x_val) == n
    assert p.splits()[2].equal(x_val)  # the same held-out split every time
    orig = p.train_original(0, "", tmp_path)
    assert orig.extras["threshold_split"] == "validation" and len(orig.extras["test_curve"]) == len(orig.curve)
    assert [c for c, _ in orig.extras["test_curve"]] == [c for c, _ in orig.curve]
    # T0 trains with the original schedule, T1 with the (here frozen: lr 1e-9) retraining schedule
    t0 = p.retrain(orig, "fc1", ProcedureSpec(name="T0", kind="T0"), 0, 30, None, tmp_path)
    t1 = p.retrain(orig, "fc1", ProcedureSpec(name="T1", kind="T1"), 0, 30, None, tmp_path)
    assert len({v for _, v in t0}) > 1 and len({v for _, v in t1}) == 1
    test = SupervisedProblem(*args, threshold_split="test")
    assert test.splits()[2] is test.data.x_test and "test_curve" not in test.train_original(0, "", tmp_path).extras
