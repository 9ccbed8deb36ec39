"""Empirical ε lower bounds (TF Privacy's ratio methods): hand-computed cases, TF Privacy's published values,
an independent Clopper–Pearson, and the properties an auditor relies on."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from modelward.errors import ConfigError, DataError
from modelward.privacy import epsilon_lower_bound
from modelward.privacy.epsilon import METHODS, perfect_separation_bound, ratio_lower_bound, threshold_counts


def test_ratio_methods_match_tf_privacy_documented_values() -> None:
    # the values in TF Privacy's RatioBound docstring (tp=[100, 90], fp=[10, 5], 110 positives, 80 negatives, α=.05)
    tp, fp = np.array([100, 90]), np.array([10, 5])
    assert ratio_lower_bound(tp, 110, fp, 80, method="bailey") == pytest.approx([4.61953896, 6.87647915], rel=1e-7)
    assert ratio_lower_bound(tp, 110, fp, 80, method="katz-log") == pytest.approx([4.45958661, 6.39712581], rel=1e-7)


def test_clopper_pearson_by_hand() -> None:
    # perfect separation of n members from n non-members: TPR ≥ (α/2)^(1/n), FPR ≤ 1 − (α/2)^(1/n)
    n = 100
    c = 0.025 ** (1 / n)
    s = np.r_[np.ones(n), np.zeros(n)]
    m = s.astype(bool)
    assert epsilon_lower_bound(s, m) == pytest.approx(math.log(c / (1 - c)), rel=1e-9)
    assert perfect_separation_bound(n) == pytest.approx(math.log(c / (1 - c)))
    # one threshold, 30/50 members above, 5/50 non-members above: written out with scipy's beta quantiles
    lo = stats.beta.ppf(0.025, 30, 21)
    hi = stats.beta.ppf(0.975, 6, 45)
    want = math.log(lo / hi)
    assert ratio_lower_bound(30, 50, 5, 50)[0] == pytest.approx(lo / hi)
    scores = np.r_[np.ones(30), np.zeros(20), np.ones(5), np.zeros(45)]
    members = np.r_[np.ones(50), np.zeros(50)].astype(bool)
    # at threshold 1: TPR/FPR bound above; TNR/FNR = (45/50)/(20/50) gives another, the larger wins
    tn_fn = math.log(stats.beta.ppf(0.025, 45, 6) / stats.beta.ppf(0.975, 21, 30))
    assert epsilon_lower_bound(scores, members, threshold=1.0) == pytest.approx(max(want, tn_fn, 0.0))


def test_clopper_pearson_agrees_with_scipy_exact_interval() -> None:
    # scipy's own exact (Clopper–Pearson) binomial interval, two-sided 95 % per proportion as in TF Privacy
    for x1, n1, x0, n0 in [(17, 40, 3, 60), (40, 40, 0, 60), (1, 10, 9, 10)]:
        p1 = stats.binomtest(x1, n1).proportion_ci(0.95, method="exact").low
        p0 = stats.binomtest(x0, n0).proportion_ci(0.95, method="exact").high
        assert ratio_lower_bound(x1, n1, x0, n0)[0] == pytest.approx(p1 / p0, rel=1e-9)


def test_delta_lowers_the_bound() -> None:
    rng = np.random.default_rng(1)
    m = rng.random(400) < 0.5
    s = rng.normal(size=400) + 2.0 * m
    e0 = epsilon_lower_bound(s, m)
    e1 = epsilon_lower_bound(s, m, delta=0.05)
    assert 0 < e1 < e0


@pytest.mark.parametrize("method", METHODS)
def test_more_separable_scores_give_larger_bounds(method: str) -> None:
    rng = np.random.default_rng(2)
    m = rng.random(2000) < 0.5
    noise = rng.normal(size=2000)
    bounds = [epsilon_lower_bound(noise + shift * m, m, method=method) for shift in (0.5, 1.5, 3.0)]
    assert bounds[0] < bounds[1] < bounds[2]


@pytest.mark.parametrize("method", METHODS)
def test_random_scores_give_about_zero(method: str) -> None:
    # no signal: the only evidence comes from the maximum over ~2000 thresholds; the exact method stays at 0
    vals = [epsilon_lower_bound(np.random.default_rng(seed).random(2000),
                                np.random.default_rng(seed + 100).random(2000) < 0.5, method=method)
            for seed in range(5)]
    assert max(vals) < (0.05 if method == "clopper-pearson" else 0.5)


def test_higher_confidence_gives_a_lower_bound() -> None:
    rng = np.random.default_rng(3)
    m = rng.random(600) < 0.5
    s = rng.normal(size=600) + 2 * m
    for method in METHODS:
        assert epsilon_lower_bound(s, m, confidence=0.99, method=method) < epsilon_lower_bound(
            s, m, confidence=0.9, method=method)


def test_reversed_scores_need_two_sided() -> None:
    rng = np.random.default_rng(4)
    m = rng.random(600) < 0.5
    s = rng.normal(size=600) - 2 * m  # the attack's direction is wrong
    assert epsilon_lower_bound(s, m) < 0.3
    assert epsilon_lower_bound(s, m, two_sided=True) == pytest.approx(epsilon_lower_bound(-s, m), rel=1e-9)


def test_ties_move_together() -> None:
    tp, fp, P, N = threshold_counts(np.array([1.0, 1.0, 0.0]), np.array([1, 0, 0]))
    assert tp.tolist() == [0, 1, 1] and fp.tolist() == [0, 1, 2] and (P, N) == (1, 2)


def test_clear_errors() -> None:
    s, m = np.array([0.1, 0.9]), np.array([0, 1])
    with pytest.raises(ConfigError, match="valid choices"):
        epsilon_lower_bound(s, m, method="wald")
    with pytest.raises(ConfigError, match="clopper-pearson"):
        epsilon_lower_bound(s, m, method="katz-log", delta=1e-5)
    with pytest.raises(ConfigError, match="confidence"):
        epsilon_lower_bound(s, m, confidence=1.5)
    with pytest.raises(DataError, match="members and non-members"):
        epsilon_lower_bound(s, np.array([1, 1]))
    with pytest.raises(DataError, match="NaN"):
        epsilon_lower_bound(np.array([np.nan, 1.0]), m)
