"""Model-level verdicts calibrated against clean reference models, class by class (detect.model.reference): a
naturally easy class is not a backdoor, a class far outside its own clean distribution is; the null's p-values are
calibrated; references are read as JSON and checked."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from modelward.backdoor.detect.model.base import ModelVerdict
from modelward.backdoor.detect.model.neural_cleanse import anomaly_index
from modelward.backdoor.detect.model.reference import CleanReference, reference_from_detect_json
from modelward.backdoor.experiment import calibrate_verdicts, read_references
from modelward.errors import ConfigError

K = 10


def clean_norms(rng: np.random.Generator, n: int) -> np.ndarray:
    """Neural Cleanse norms of clean models whose class 9 is naturally easy (a 30 % smaller trigger), with 5 %
    model-to-model noise per class — the rgb bench's situation (docs/backdoor.md)."""
    base = np.full(K, 50.0)
    base[9] = 35.0
    return base * np.exp(0.05 * rng.standard_normal((n, K)))


def nc(per_class: np.ndarray) -> ModelVerdict:
    ai, k = anomaly_index(list(map(float, per_class)))
    return ModelVerdict("neural_cleanse", ai, 2.0, ai > 2.0, k, list(map(float, per_class)))


def test_a_naturally_easy_class_is_not_a_backdoor_a_target_is() -> None:
    rng = np.random.default_rng(0)
    cal = CleanReference("neural_cleanse", clean_norms(rng, 8))
    clean = nc(clean_norms(rng, 1)[0])
    assert clean.backdoored  # the papers' anomaly index flags the easy class ...
    got = cal.test(clean)
    assert not got.backdoored and got.p_value is not None and got.p_value > 0.05  # ... its clean reference does not
    assert got.detector == "neural_cleanse_reference" and got.extra["uncalibrated_backdoored"]
    bd = clean_norms(rng, 1)[0]
    bd[2] = 25.0  # class 2's trigger half its clean size: a backdoor target
    got = cal.test(nc(bd))
    assert got.backdoored and got.suspect_class == 2 and got.statistic > got.threshold
    assert len(got.per_class) == K and int(np.argmax(got.per_class)) == 2
    far = clean_norms(rng, 1)[0]
    far[2] = 30.0  # far out in the tail: p is tiny but positive and exact, not a rounded 1 − 1
    p, _ = cal.p_value(far)
    assert 0.0 < p < 1e-10


def test_mmbd_is_oriented_the_other_way() -> None:
    rng = np.random.default_rng(1)
    margins = 40.0 * np.exp(0.05 * rng.standard_normal((6, K)))
    cal = CleanReference("mmbd", margins)
    m = 40.0 * np.exp(0.05 * rng.standard_normal(K))
    small, big = m.copy(), m.copy()
    small[4], big[4] = 20.0, 80.0
    assert not cal.test(ModelVerdict("mmbd", 0.0, 1.3, False, 0, list(small))).backdoored
    out = cal.test(ModelVerdict("mmbd", 0.0, 1.3, False, 0, list(big)))
    assert out.backdoored and out.suspect_class == 4


def test_p_values_under_the_null_are_calibrated() -> None:
    """Clean models drawn from the references' own distribution: about ``alpha`` of them flagged (the Šidák
    p-value of the largest z, σ from leave-one-out residuals). 400 draws: the binomial sd at 0.05 is 1.1 points,
    and the reference's own estimation error widens it; the bound is loose enough for both."""
    rng = np.random.default_rng(2)
    cal = CleanReference("neural_cleanse", clean_norms(rng, 10))
    p = np.array([cal.p_value(row)[0] for row in clean_norms(rng, 400)])
    assert 0.0 < float((p < 0.05).mean()) < 0.15
    assert 0.2 < float(np.median(p)) < 0.8


def test_bad_references_are_refused_with_a_reason(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="at least 3"):
        CleanReference("neural_cleanse", [[1.0, 2.0], [1.0, 2.0]])
    with pytest.raises(ConfigError, match="not one of"):
        CleanReference("strip", [[1.0, 2.0]] * 3)
    with pytest.raises(ConfigError, match="positive"):
        CleanReference("mmbd", [[1.0, -2.0]] * 3)
    cal = CleanReference("neural_cleanse", [[1.0, 2.0, 3.0]] * 3)
    with pytest.raises(ConfigError, match="the references 3"):
        cal.z_scores([1.0, 2.0])
    with pytest.raises(ConfigError, match="mmbd"):
        cal.test(ModelVerdict("mmbd", 0.0, 1.3, False, 0, [1.0, 2.0, 3.0]))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "detect.json").write_text("not json")
    with pytest.raises(ConfigError, match="not a readable"):
        read_references([str(bad)])
    (bad / "detect.json").write_text(json.dumps({"verdicts": "none"}))
    with pytest.raises(ConfigError, match="verdicts"):
        read_references([str(bad / "detect.json")])
    with pytest.raises(ConfigError, match="no mmbd verdict"):
        reference_from_detect_json([{"verdicts": [{"detector": "neural_cleanse", "per_class": [1.0, 2.0]}]}] * 3,
                                   "mmbd")


def test_detect_json_references_calibrate_each_detector(tmp_path: Path) -> None:
    """The files `modelward backdoor detect` writes for clean models are the references of the next run."""
    rng = np.random.default_rng(3)
    paths = []
    margins = 40.0 * np.exp(0.05 * rng.standard_normal((4, K)))
    for i, (n, m) in enumerate(zip(clean_norms(rng, 4), margins, strict=True)):
        d = tmp_path / f"ref{i}"
        d.mkdir()
        (d / "detect.json").write_text(json.dumps({"verdicts": [nc(n).to_dict(), ModelVerdict(
            "mmbd", 0.5, 1.3, False, 0, list(map(float, m))).to_dict()]}))
        paths.append(str(d))
    bd = clean_norms(rng, 1)[0]
    bd[6] = 20.0
    out = calibrate_verdicts([nc(bd)], read_references(paths), 0.05)
    assert [v.detector for v in out] == ["neural_cleanse_reference"]
    assert out[0].backdoored and out[0].suspect_class == 6 and out[0].extra["references"] == 4
