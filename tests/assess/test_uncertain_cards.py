"""Issue 38 (findings3): cards whose number has no interval are not rated on their point estimate.

- completion: MC-hardness from one seed is amber whatever its value, and says so; with several seeds the t interval
  decides (green and red possible);
- backdoor: the counted rates carry Clopper–Pearson intervals; the detectors' statistics say they have none.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from modelward.assess import AssessConfig, run_assessment
from modelward.assess.findings import clopper_pearson, section_findings
from modelward.assess.sections.common import SectionResult


def _study(folder: Path, mean: float, sd: float, n: int) -> Path:
    folder.mkdir(parents=True)
    cols = ["part", "procedure", "group", "alpha", "median", "mean", "sd", "min", "max", "n"]
    with (folder / "hardness.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, cols)
        w.writeheader()
        for part in ("fc1", "fc2"):
            w.writerow({"part": part, "procedure": "T1", "group": "all", "alpha": 0.9, "median": mean, "mean": mean,
                        "sd": sd if n > 1 else float("nan"), "min": mean, "max": mean, "n": n})
    return folder


def _completion(tmp: Path, mean: float, sd: float, n: int, monkeypatch: pytest.MonkeyPatch) -> dict:
    # the model is an untrained factory (the card reads the study given, nothing is trained): without this, the
    # near-chance warning would turn every verdict into "for information"
    monkeypatch.setattr("modelward.assess.target.quality_warning", lambda target, expected=None: (0.9, None))
    cfg = AssessConfig.model_validate({
        "model": {"arch": "entrypoint", "entrypoint": "modelward.cost.models:square_mlp", "kwargs": {"hidden": [8]}},
        "data": {"source": "synthetic_tabular", "n_samples": 200, "n_features": 6, "num_classes": 2},
        "sections": ["completion"],
        "split": {"parties": {"alice": ["fc1"], "bob": ["fc2"]},
                  "study": str(_study(tmp / "study", mean, sd, n))}})
    run_assessment(cfg, tmp / "out")
    sec = json.loads((tmp / "out" / "report.json").read_text())["sections"][0]
    assert sec["status"] == "assessed", sec.get("reason")
    return sec


@pytest.mark.parametrize("mean,sd,n,verdict", [(0.95, 0.0, 1, "amber"), (0.2, 0.0, 1, "amber"),
                                               (0.95, 0.01, 3, "green"), (0.2, 0.02, 3, "red"),
                                               (0.95, 0.2, 3, "amber")])
def test_mc_hardness_from_one_seed_is_amber_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         mean: float, sd: float, n: int, verdict: str) -> None:
    sec = _completion(tmp_path, mean, sd, n, monkeypatch)
    assert sec["verdict"] == verdict
    m = sec["metrics"][0]
    finding = sec["findings"][0]
    assert finding["severity"] == {"amber": "medium", "green": "low", "red": "high"}[verdict]
    if n == 1:
        assert m["ci"] is None and "no interval: one seed" in sec["rule"] and f"{mean:.2f}" in sec["rule"]
    else:
        assert m["ci"][0] < mean < m["ci"][1] and "one seed" not in sec["rule"]


def _detector_section(ai: float, p: float) -> SectionResult:
    res = SectionResult("backdoor", "Backdoors")
    res.add_metric("neural_cleanse_anomaly_index", "Neural Cleanse anomaly index", ai, risk_up=True, unit="score",
                   headline=True, context={"thresholds": [2.0, 3.0], "rule": "green ≤ 2"})
    res.add_metric("mmbd_p_value", "MM-BD p-value", p, risk_up=False, unit="score",
                   context={"thresholds": [0.05, 0.001], "rule": "green ≥ 0.05"})
    return res


@pytest.mark.parametrize("ai,p,agree,nc,mm", [
    (9.0, 0.5, True, "medium", "low"),      # a lone flag far past its threshold: not high on one run of one detector
    (1.5, 1e-6, True, "low", "medium"),
    (2.5, 0.01, True, "high", "high"),      # both flag the same class: the card's red, both findings high
    (2.5, 0.01, False, "medium", "medium"),  # they name different classes: amber
    (1.2, 0.4, True, "low", "low")])
def test_backdoor_detector_statistics_have_no_interval_and_are_rated_conservatively(
        ai: float, p: float, agree: bool, nc: str, mm: str) -> None:
    from modelward.assess.sections.backdoor import _rate_without_interval

    res = _detector_section(ai, p)
    flags = {"neural_cleanse_anomaly_index": ai > 2, "mmbd_p_value": p < 0.05}
    _rate_without_interval(res, flags, all(flags.values()) and agree)
    by = {f["metric"]: f for f in section_findings(res.to_dict(), "modelward assess x.toml")}
    assert (by["neural_cleanse_anomaly_index"]["severity"], by["mmbd_p_value"]["severity"]) == (nc, mm)
    assert all(f["ci"] is None and "no interval" in f["rule"] for f in by.values())
    # a statistic whose severity a section already fixed (for information, with clean references) keeps it
    res = _detector_section(ai, p)
    res.metrics[0]["context"]["severity"] = "info"
    _rate_without_interval(res, flags, True)
    assert res.metrics[0]["context"]["severity"] == "info"


def test_backdoor_repair_rates_carry_clopper_pearson_intervals() -> None:
    from modelward.assess.sections.backdoor import _repair_rates

    res = SectionResult("backdoor", "Backdoors")
    _repair_rates(res, {"attack_success_rate": 3 / 180, "asr_hits": 3, "asr_n": 180, "clean_accuracy": 190 / 200,
                        "clean_correct": 190, "clean_n": 200}, "7")
    asr, clean = res.metrics
    assert asr["ci"] == pytest.approx(list(clopper_pearson(3, 180))) and (asr["k"], asr["n"]) == (3, 180)
    assert clean["ci"] == pytest.approx(list(clopper_pearson(190, 200)))
    assert all(m["context"]["severity"] == "info" for m in res.metrics)
