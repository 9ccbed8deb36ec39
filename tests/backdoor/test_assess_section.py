"""The assess section: a backdoored model gets a red verdict naming the target, with OWASP ML10 / ATLAS ids, an
interval and a measured repair; a clean model does not; non-image data is not assessed, saying why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from modelward.assess.config import SECTIONS, AssessConfig
from modelward.assess.findings import attach_findings
from modelward.assess.profiles import PROFILES
from modelward.assess.sections import backdoor as section
from modelward.assess.sections.common import NotAssessed
from modelward.assess.target import Target
from modelward.backdoor.experiment import Trained
from modelward.core.data import DataConfig, load_data

from .conftest import TARGET


def _assess(t: Trained, tmp_path: Path) -> dict:
    cfg = AssessConfig(checkpoint="unused.safetensors", sections=["backdoor"])
    target = Target(t.model, t.data, lambda: t.model, None, None, "zoo", "digits CNN", membership="test split")
    out = tmp_path / "backdoor"
    out.mkdir(parents=True)
    res = section.run(cfg, target, PROFILES["quick"], out, tmp_path)
    return attach_findings(json.loads(json.dumps(res.to_dict())), tmp_path)


def test_backdoored_model_is_red_with_frameworks_interval_and_measured_repair(backdoored: Trained,
                                                                              tmp_path: Path) -> None:
    sec = _assess(backdoored, tmp_path)
    assert sec["verdict"] == "red" and "backdoor" in SECTIONS
    assert sec["headline"]["value"] > 2 and f"class {TARGET}" in sec["headline"]["text"]
    by = {f["metric"]: f for f in sec["findings"]}
    nc = by["neural_cleanse_anomaly_index"]
    assert nc["severity"] == "high" and nc["headline"]
    assert any("ML10" in o for o in nc["owasp"]) and any("AML.T0018" in a for a in nc["atlas"])
    assert "measured here" in nc["actions"][0] and "→" in nc["actions"][0]
    rt = by["reversed_trigger_success"]
    assert rt["ci"][0] <= rt["value"] <= rt["ci"][1] and rt["value"] > 0.8 and rt["n"] > 100
    data = by["activation_clustering_classes"]
    assert any("ML02" in o for o in data["owasp"]) and any("AML.T0020" in a for a in data["atlas"])
    tables = {t["name"]: t for t in sec["tables"]}
    assert tables["unlearning"]["rows"][1]["attack_success_rate"] < tables["unlearning"]["rows"][0][
        "attack_success_rate"]
    assert len(tables["suspected_rows"]["rows"]) == 20 and sec["figures"]
    assert all((tmp_path / f["path"]).is_file() for f in sec["figures"])


def test_clean_model_is_not_red(clean: Trained, tmp_path: Path) -> None:
    sec = _assess(clean, tmp_path)
    assert sec["verdict"] in ("green", "amber")
    assert "unlearning" not in {t["name"] for t in sec["tables"]} or sec["verdict"] == "amber"


def test_tabular_data_is_not_assessed(tmp_path: Path) -> None:
    d = load_data(DataConfig(source="breast_cancer"))
    m = torch.nn.Linear(d.x_train.shape[1], 2)
    target = Target(m, d, lambda: m, None, None, "entrypoint", "linear")
    with pytest.raises(NotAssessed, match="images"):
        section.run(AssessConfig(checkpoint="x.safetensors"), target, PROFILES["quick"], tmp_path, tmp_path)
