"""Issue 38: every card colour and every diff gate of assess rests on an interval, not on a point estimate."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest

from modelward.assess.diff import compare, parse_fail_on
from modelward.assess.findings import clopper_pearson, rate_metric, severity_from
from modelward.assess.sections.common import STRADDLES, SectionResult
from modelward.assess.sections.robustness import THRESHOLDS, add_threat_metric, set_threat_headline
from modelward.core.stats import newcombe_paired


@pytest.mark.parametrize("k,n", [(0, 10), (3, 10), (10, 10), (72, 100), (1480, 2000), (1, 250)])
def test_clopper_pearson_equals_scipys_exact_interval(k: int, n: int) -> None:
    ref = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    lo, hi = clopper_pearson(k, n)
    assert lo == pytest.approx(ref.low, abs=1e-12) and hi == pytest.approx(ref.high, abs=1e-12)


def _robustness(acc: float, n: int, outcomes: np.ndarray | None = None) -> SectionResult:
    res = SectionResult("robustness", "Robustness")
    add_threat_metric(res, "pgd", "linf", 0.03, acc, n, "pixels",
                      outcomes=None if outcomes is None else outcomes.tolist(), points=None if outcomes is None
                      else {"indices": "x_test[0:n]", "n": n, "sha256": "a" * 64})
    set_threat_headline(res)
    return res


@pytest.mark.parametrize("acc,n,verdict", [(0.72, 100, "amber"), (0.72, 5000, "green"), (0.38, 100, "amber"),
                                           (0.38, 5000, "red"), (0.55, 100, "amber"), (0.95, 100, "green")])
def test_a_robustness_card_is_amber_when_its_interval_straddles_a_threshold(acc: float, n: int, verdict: str) -> None:
    res = _robustness(acc, n)
    assert res.verdict == verdict
    lo, hi = res.metrics[0]["ci"]
    assert (lo, hi) == pytest.approx(clopper_pearson(round(acc * n), n))
    straddling = any(lo < t < hi for t in THRESHOLDS)
    assert (STRADDLES in res.rule) == straddling  # the card says why it is amber


def test_severity_rates_the_interval_not_the_point() -> None:
    # risk-up (a TPR, thresholds 2 % / 5 %): a point in the green band whose interval reaches past 2 % is medium
    assert severity_from(0.015, (0.02, 0.05), True, ci=(0.005, 0.04)) == "medium"
    assert severity_from(0.08, (0.02, 0.05), True, ci=(0.06, 0.10)) == "high"
    assert severity_from(0.08, (0.02, 0.05), True, ci=(0.04, 0.12)) == "medium"
    assert severity_from(0.01, (0.02, 0.05), True, ci=(0.0, 0.019)) == "low"
    assert severity_from(0.08, (0.02, 0.05), True) == "high"  # no interval: the point is rated


def test_newcombe_paired_covers_the_true_difference() -> None:
    """Coverage of Newcombe's paired method 10 on correlated runs (two evaluations of the same points)."""
    rng = np.random.default_rng(0)
    n, trials, covered = 300, 400, 0
    for _ in range(trials):
        first = rng.random(n) < 0.7
        flip_down = first & (rng.random(n) < 0.10)  # true p2 − p1 = 0.3 · 0.10 − 0.7 · 0.10 = −0.04
        flip_up = ~first & (rng.random(n) < 0.10)
        second = (first & ~flip_down) | flip_up
        a = int((first & second).sum())
        b = int((first & ~second).sum())
        c = int((~first & second).sum())
        lo, hi = newcombe_paired(a, b, c, n - a - b - c)
        covered += lo <= 0.3 * 0.10 - 0.7 * 0.10 <= hi
    assert 0.92 <= covered / trials <= 0.99  # nominal 95 %


def test_two_honest_runs_do_not_fire_the_robustness_gate_and_a_real_drop_does() -> None:
    rng = np.random.default_rng(1)
    gates = parse_fail_on("robustness:-5")
    n = 500
    # ten pairs of honest runs on different points (unpaired) and on the same points (paired: PGD's random start)
    alarms = 0
    for _ in range(10):
        a, b = rng.random(n) < 0.75, rng.random(n) < 0.75
        alarms += any(c.gated for c in compare(_report(a), _report(b), gates))
        again = np.where(rng.random(n) < 0.03, ~a, a)  # 3 % of the points flip either way between restarts
        alarms += any(c.gated for c in compare(_report(a, paired=True), _report(again, paired=True), gates))
    assert alarms == 0
    # a real drop of 15 points fires, unpaired and paired
    a = rng.random(n) < 0.75
    worse = a & (rng.random(n) >= 0.2)
    assert any(c.gated == "robustness:-5" for c in compare(_report(a), _report(worse), gates))
    assert any(c.gated == "robustness:-5" for c in compare(_report(a, paired=True), _report(worse, paired=True),
                                                           gates))


def _report(outcomes: np.ndarray, paired: bool = False) -> dict:
    res = _robustness(float(outcomes.mean()), len(outcomes), outcomes if paired else None)
    return {"sections": [res.to_dict()]}


def test_completion_and_extraction_style_metrics_are_rated_by_their_intervals() -> None:
    # MC-hardness over seeds (t interval) straddling 0.8 is amber, whatever the mean
    m = {"value": 0.85, "risk_up": False, "ci": [0.7, 1.0], "context": {"thresholds": [0.8, 0.5]}}
    assert rate_metric(m) == "medium"
    m["ci"] = [0.82, 0.88]
    assert rate_metric(m) == "low"
