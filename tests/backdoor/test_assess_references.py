"""The assess backdoor section with clean references ([backdoor] reference, issue 41): the calibrated rule decides and
the card says so; bad references are refused before any work, naming the field and the path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from modelward.assess.config import AssessConfig
from modelward.assess.findings import attach_findings
from modelward.assess.profiles import PROFILES
from modelward.assess.sections import backdoor as section
from modelward.assess.target import Target
from modelward.backdoor.experiment import Trained
from modelward.errors import ConfigError

from .conftest import TARGET


def _run(t: Trained, tmp_path: Path, name: str, reference: list[str] | None = None) -> dict:
    cfg = AssessConfig(checkpoint="unused.safetensors", sections=["backdoor"],
                       backdoor={"reference": reference or []})
    target = Target(t.model, t.data, lambda: t.model, None, None, "zoo", "digits CNN", membership="test split")
    out = tmp_path / name / "backdoor"
    out.mkdir(parents=True)
    res = section.run(cfg, target, PROFILES["quick"], out, tmp_path / name)
    return attach_findings(json.loads(json.dumps(res.to_dict())), tmp_path / name)


def _jittered_references(detect_json: Path, tmp_path: Path, n: int = 4) -> list[str]:
    """n clean references from one clean model's detect.json, each class's statistics scaled by a few per cent (the
    spread of clean models is what the calibration estimates; one trained model per test is what the budget allows)."""
    base = json.loads(detect_json.read_text())
    paths = []
    for j in range(n):
        ref = json.loads(json.dumps(base))
        for v in ref["verdicts"]:
            v["per_class"] = [s * (1 + 0.03 * ((i * 7 + j * 3) % 5 - 2)) for i, s in enumerate(v["per_class"])]
        p = tmp_path / f"ref{j}" / "detect.json"
        p.parent.mkdir()
        p.write_text(json.dumps(ref))
        paths.append(str(p.parent))  # a folder holding detect.json, as an assessment's backdoor/ folder
    return paths


@pytest.mark.slow
def test_backdoored_model_against_clean_references_is_red_and_the_card_says_which_rule(
        clean: Trained, backdoored: Trained, tmp_path: Path) -> None:
    plain = _run(clean, tmp_path, "clean")
    assert plain["rule"].startswith("decided by the papers' thresholds")
    refs = _jittered_references(tmp_path / "clean" / "backdoor" / "detect.json", tmp_path)
    sec = _run(backdoored, tmp_path, "suspect", refs)
    assert sec["verdict"] == "red" and sec["rule"].startswith("decided against 4 clean reference models")
    by = {f["metric"]: f for f in sec["findings"]}
    head = by["neural_cleanse_reference_p_value"]
    assert head["headline"] and head["severity"] == "high" and f"({TARGET})" in head["title"]
    assert by["mmbd_reference_p_value"]["value"] < 0.05
    assert by["neural_cleanse_anomaly_index"]["severity"] == "info"  # the papers' statistic no longer decides
    assert "measured here" in head["actions"][0]
    tables = {t["name"]: t for t in sec["tables"]}
    rows = tables["reference_verdicts"]["rows"]
    assert [r["flagged"] for r in rows] == [True, True] and {r["suspect_class"] for r in rows} == {str(TARGET)}
    assert "settings match" in " ".join(tables["reference_verdicts"]["notes"])


def test_too_few_references_are_refused_by_the_config() -> None:
    with pytest.raises(ValidationError, match="at least 3 clean reference"):
        AssessConfig(checkpoint="x.safetensors", backdoor={"reference": ["a", "b"]})
    cfg = AssessConfig(checkpoint="x.safetensors")
    assert "backdoor" not in cfg.model_dump()  # at its default: earlier assessments' fingerprints still match


def test_relative_references_resolve_against_the_config_folder(tmp_path: Path) -> None:
    cfg = AssessConfig(checkpoint="x.safetensors", backdoor={"reference": ["r0", "r1", "/abs/r2"]})
    got = cfg.resolve_paths(tmp_path).backdoor.reference
    assert got == [str((tmp_path / "r0").resolve()), str((tmp_path / "r1").resolve()), "/abs/r2"]


def test_unreadable_or_mismatched_references_are_refused_naming_the_path(clean: Trained, tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"verdicts": [], "settings": {"mmbd": {"starts": 1, "steps": 2, "optimizer": "adam",
                                                                      "lr": 0.05}}}))
    missing = str(tmp_path / "nowhere" / "detect.json")
    with pytest.raises(ConfigError, match=r"backdoor\.reference: .*nowhere.* not a readable detect\.json"):
        _run(clean, tmp_path, "a", [str(good), str(good), missing])
    pickle_like = tmp_path / "model.pkl"
    pickle_like.write_bytes(b"\x80\x04K\x01.")  # not JSON: never unpickled
    with pytest.raises(ConfigError, match=r"backdoor\.reference: .*model\.pkl"):
        _run(clean, tmp_path, "b", [str(good), str(good), str(pickle_like)])
    with pytest.raises(ConfigError, match=r"good\.json was made with mmbd settings .* comparable only with the same"):
        _run(clean, tmp_path, "c", [str(good), str(good), str(good)])  # quick profile: 30 starts x 300 steps
