"""Per-slice and per-record membership risk."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from modelward.errors import DataError
from modelward.privacy.risk import exposed_records, slice_risk


def test_the_leaking_class_is_named_worst() -> None:
    rng = np.random.default_rng(0)
    n = 2000
    labels = rng.integers(0, 4, n)
    members = rng.random(n) < 0.5
    scores = rng.normal(size=n) + 3.0 * (members & (labels == 2))  # only class 2 leaks
    rows, worst = slice_risk(scores, members, labels, np.ones(n, bool))
    assert worst is not None and worst["slice"] == "class=2"
    by = {r["slice"]: r for r in rows}
    assert by["class=2"]["auc"] > 0.9 > 0.6 > by["class=0"]["auc"]
    assert by["class=2"]["epsilon_lb"] > 1 and by["class=0"]["epsilon_lb"] < 0.5
    assert "misclassified" not in by  # empty slices are left out


def test_small_slices_are_listed_but_not_ranked() -> None:
    rng = np.random.default_rng(1)
    members = rng.random(300) < 0.5
    correct = np.ones(300, bool)
    correct[:10] = False
    scores = rng.normal(size=300)
    scores[:10] += 10 * members[:10]  # a perfect but tiny slice
    rows, worst = slice_risk(scores, members, np.zeros(300, int), correct)
    tiny = next(r for r in rows if r["slice"] == "misclassified")
    assert not tiny["ranked"] and worst["slice"] != "misclassified"


def test_exposure_and_its_interval_by_hand() -> None:
    # 4 non-members at 0, 1, 2, 3; member A at 2.5 (1 non-member ≥), member B at 10 (0 ≥)
    scores = np.array([0.0, 1.0, 2.0, 3.0, 2.5, 10.0])
    members = np.array([0, 0, 0, 0, 1, 1], bool)
    recs = exposed_records(scores, members, record_ids=np.array([10, 11, 12, 13, 14, 15]))
    assert [r["record"] for r in recs] == [15, 14]
    assert recs[0]["exposure_fpr"] == 0.0 and recs[0]["fpr_low"] == 0.0
    assert recs[0]["fpr_high"] == pytest.approx(1 - 0.025 ** (1 / 4))
    assert recs[1]["exposure_fpr"] == 0.25
    assert recs[1]["fpr_low"] == pytest.approx(stats.beta.ppf(0.025, 1, 4))
    assert recs[1]["fpr_high"] == pytest.approx(stats.beta.ppf(0.975, 2, 3))
    assert len(exposed_records(np.arange(100.0), np.arange(100) % 2 == 0)) == 20


def test_errors() -> None:
    with pytest.raises(DataError, match="labels"):
        slice_risk(np.zeros(3), np.ones(3, bool), np.zeros(2), np.ones(3, bool))
    with pytest.raises(DataError, match="record ids"):
        exposed_records(np.zeros(2), np.array([1, 0], bool), record_ids=np.zeros(3))
