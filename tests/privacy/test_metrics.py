"""Membership metrics: thesis conventions, ROC/AUC against scikit-learn, saved arrays, DP bounds."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from modelward.errors import DataError
from modelward.privacy import metrics


def test_auc_matches_sklearn_including_ties() -> None:
    rng = np.random.default_rng(0)
    m = rng.random(500) < 0.5
    s = np.round(rng.normal(size=500) + m * 0.7, 1)  # rounding creates ties
    f, t, _ = metrics.roc_curve(s, m)
    assert metrics.auc(f, t) == pytest.approx(roc_auc_score(m, s), abs=1e-12)
    assert f[0] == 0 and t[0] == 0 and f[-1] == 1 and t[-1] == 1


def test_thesis_conventions_advantage_and_precision_rule() -> None:
    members = np.array([1, 1, 1, 1, 0, 0, 0, 0], bool)
    scores = np.array([0.9, 0.8, 0.2, 0.1, 0.7, 0.3, 0.2, 0.1])
    m = metrics.evaluate(scores, members, 0.5)
    assert m.tpr == 0.5 and m.fpr == 0.25
    assert m.accuracy == pytest.approx(0.625) and m.advantage == pytest.approx(m.tpr - m.fpr)
    assert m.precision == pytest.approx(2 / 3)
    # nobody predicted a member ⇒ precision ½ (§8.3.3)
    assert metrics.evaluate(scores, members, 10.0).precision == 0.5


def test_tpr_at_low_fpr() -> None:
    members = np.r_[np.ones(1000, bool), np.zeros(1000, bool)]
    scores = np.r_[np.linspace(1, 2, 1000), np.linspace(0, 1.5, 1000)]
    f, t, _ = metrics.roc_curve(scores, members)
    # non-members above 1.5 − ε: only the top one; members above it: the top third
    assert metrics.tpr_at_fpr(f, t, 0.001) == pytest.approx(0.5, abs=0.01)
    assert metrics.tpr_at_fpr(f, t, 0.0) <= metrics.tpr_at_fpr(f, t, 0.01)


def test_saved_arrays_recompute_the_metrics(tmp_path) -> None:
    rng = np.random.default_rng(1)
    members = rng.random(50) < 0.5
    scores = rng.normal(size=50) + members
    paths = metrics.save_scores(tmp_path, "a_r0", scores, members, threshold=0.0)
    s2, m2 = np.load(paths["scores"]), np.load(paths["members"])
    assert metrics.evaluate(s2, m2, 0.0) == metrics.evaluate(scores, members, 0.0)
    rows = paths["csv"].read_text().splitlines()
    assert rows[0] == "index,score,member,decision" and len(rows) == 51


def test_bad_inputs_are_clear_errors() -> None:
    with pytest.raises(DataError, match="differ in length"):
        metrics.evaluate(np.zeros(3), np.zeros(2, bool), 0.0)
    with pytest.raises(DataError, match="both members and non-members"):
        metrics.evaluate(np.zeros(3), np.ones(3, bool), 0.0)


def test_dp_advantage_bounds() -> None:
    b = metrics.dp_advantage_bounds(0.25)
    assert b["max_accuracy_yeom"] == pytest.approx(0.642, abs=1e-3)  # App. C: 64.2 % at ε = 0.25
    assert b["hypothesis_test"] == pytest.approx(np.tanh(0.125))  # δ = 0: (e^ε − 1)/(e^ε + 1)
    assert metrics.dp_advantage_bounds(1.0)["yeom"] == 1.0  # e − 1 > 1: vacuous
    assert metrics.dp_advantage_bounds(1.0, 1e-5)["hypothesis_test"] > metrics.dp_advantage_bounds(1.0)[
        "hypothesis_test"]
