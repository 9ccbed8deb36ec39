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
