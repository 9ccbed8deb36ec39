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
