"""SARIF output validated against the OASIS SARIF 2.1.0 schema (vendored in tests/assess/data), the CycloneDX BOM
against CycloneDX's own schema, and `assess diff`: a seeded 5-point robustness drop is caught, ten re-runs of the
same assessment with other attack seeds raise no alarm."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from modelward.assess.diff import compare, newcombe, parse_fail_on
from modelward.assess.findings import section_findings
from modelward.assess.outcomes import pack_outcomes
from modelward.assess.sarif import to_sarif
from modelward.assess.sections.common import SectionResult
from modelward.errors import ConfigError

SCHEMA = Path(__file__).parent / "data" / "sarif-schema-2.1.0.json"


def _validate_sarif(log: dict) -> None:
    import jsonschema

    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft4Validator.check_schema(schema)
    jsonschema.Draft4Validator(schema).validate(log)


def _report(robust_k: int, n: int, tpr_k: int = 3, m: int = 300, outcomes: np.ndarray | None = None) -> dict:
    """A report.json with the metrics real sections record (through SectionResult.add_metric); with `outcomes`
    the robustness metric carries its per-point results on the points with id "p0…" (the diff then pairs them)."""
    rob = SectionResult("robustness", "Robustness")
    per_point = {} if outcomes is None else {"outcomes": pack_outcomes(outcomes),
                                             "points": {"indices": "x_test[0:n]", "n": n, "sha256": "p0" * 32}}
    rob.add_metric("pgd_linf@0.1", "PGD-L∞ robust accuracy at ε = 0.1", robust_k / n, k=robust_k, n=n,
                   risk_up=False, headline=True,
                   context={"thresholds": [0.7, 0.4], "rule": "green ≥ 70 %", **per_point})
    priv = SectionResult("privacy", "Privacy")
    priv.add_metric("tpr_at_1pct_fpr.lira", "LiRA TPR at 1 % FPR", tpr_k / m, k=tpr_k, n=m, risk_up=True,
                    headline=True, context={"thresholds": [0.02, 0.05]})
    sections = []
    for s in (rob, priv):
        d = s.to_dict()
        d["findings"] = section_findings(d, f"modelward assess x.toml --out y --set 'sections=[\"{s.section}\"]'")
        sections.append(d)
    return {"sections": sections, "findings": [f for s in sections for f in s["findings"]]}


def test_sarif_of_findings_is_valid_sarif_2_1_0(tmp_path: Path) -> None:
    pytest.importorskip("picklescan", reason="the picklescan package is not installed (modelward[scan])")
    from modelward.assess.findings import scan_findings
    from modelward.scan import scan_file

    torch.save({"w": torch.zeros(2)}, tmp_path / "m.pt")
    findings = _report(150, 200)["findings"] + scan_findings(scan_file(tmp_path / "m.pt"))
    log = to_sarif(findings, default_location=str(tmp_path / "report.html"))
    _validate_sarif(log)
    results = log["runs"][0]["results"]
    assert len(results) == len(findings)
    rules = log["runs"][0]["tool"]["driver"]["rules"]
    assert all(any(t.startswith("ML") for t in r["properties"]["tags"]) for r in rules)
    assert all(any(t.startswith("AML.T") for t in r["properties"]["tags"]) for r in rules)
    # a broken log is rejected by the same validation (the test can fail)
    import jsonschema

    log["runs"][0]["results"][0]["level"] = "fatal"
    with pytest.raises(jsonschema.ValidationError):
        _validate_sarif(log)


def test_sarif_locations_are_relative_to_the_base_and_portable(tmp_path: Path) -> None:
    """Issue 38 item 7: locations were absolute file:/// URIs of the machine that ran the scan."""
    pytest.importorskip("picklescan", reason="the picklescan package is not installed (modelward[scan])")
    from modelward.assess.findings import scan_findings
    from modelward.scan import scan_file

    (tmp_path / "models").mkdir()
    torch.save({"w": torch.zeros(2)}, tmp_path / "models" / "m 1.pt")
    findings = _report(150, 200)["findings"] + scan_findings(scan_file(tmp_path / "models" / "m 1.pt"))
    log = to_sarif(findings, default_location=str(tmp_path / "assess-out" / "report.html"), base=tmp_path)
    _validate_sarif(log)
    run = log["runs"][0]
    locations = [loc["physicalLocation"]["artifactLocation"] for r in run["results"] for loc in r["locations"]]
    assert {loc["uriBaseId"] for loc in locations} == {"%SRCROOT%"}
    assert {loc["uri"] for loc in locations} == {"models/m%201.pt", "assess-out/report.html"}
    assert "file://" not in json.dumps(run["results"])
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"] == tmp_path.resolve().as_uri() + "/"
    # a file outside the base keeps its absolute URI
    elsewhere = to_sarif(findings, base=tmp_path / "models" / "sub")["runs"][0]["results"][-1]["locations"][0]
    assert elsewhere["physicalLocation"]["artifactLocation"]["uri"].startswith("file:///")


def test_newcombe_interval_agrees_with_a_wald_interval_at_large_n() -> None:
    lo, hi = newcombe(7000, 10000, 6500, 10000)
    se = (0.7 * 0.3 / 10000 + 0.65 * 0.35 / 10000) ** 0.5
    assert lo == pytest.approx(-0.05 - 1.96 * se, abs=2e-3) and hi == pytest.approx(-0.05 + 1.96 * se, abs=2e-3)


def _robust_flags(seed: int, x: torch.Tensor, y: torch.Tensor, model: torch.nn.Module) -> np.ndarray:
    from modelward.robustness.attacks import attack_mode, make_attack, predict

    with attack_mode(model):
        correct = (predict(model, x) == y).numpy()
    res = make_attack("pgd", model, eps=0.15, norm="linf", steps=5, clip=(-10.0, 10.0), seed=seed)(x, y)
    return correct & ~res.success.numpy()


def test_diff_catches_a_seeded_8_point_drop_and_not_reruns() -> None:
    torch.manual_seed(0)
    n = 2000
    x = torch.randn(n, 6)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(100):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    model.eval()
    base = _robust_flags(0, x, y, model)
    old = _report(int(base.sum()), n)
    gates = parse_fail_on("robustness:-5,privacy:+2")
    # ten re-runs of the same assessment: PGD's random start drawn from another seed each time
    alarms = 0
    for seed in range(1, 11):
        again = _report(int(_robust_flags(seed, x, y, model).sum()), n)
        alarms += sum(bool(c.gated) for c in compare(old, again, gates))
    assert alarms == 0
    # ten re-runs, paired on the same points with their per-point outcomes: no alarm either
    paired_old = _report(int(base.sum()), n, outcomes=base)
    for seed in range(1, 11):
        flags = _robust_flags(seed, x, y, model)
        assert not any(c.gated for c in compare(paired_old, _report(int(flags.sum()), n, outcomes=flags), gates))
    # a seeded drop: 8 % of the points (drawn with seed 0 among the robust ones) are no longer robust; the gate
    # fires once the whole interval of the change is below −5 points (issue 38), unpaired and paired
    rng = np.random.default_rng(0)
    dropped = base.copy()
    dropped[rng.choice(np.flatnonzero(base), size=n * 8 // 100, replace=False)] = False
    for o, d in ((old, _report(int(dropped.sum()), n)),
                 (paired_old, _report(int(dropped.sum()), n, outcomes=dropped))):
        gated = [c for c in compare(o, d, gates) if c.gated]
        assert [c.key for c in gated] == ["pgd_linf@0.1"] and gated[0].delta == pytest.approx(-8.0)
        assert gated[0].delta_ci[1] < -5  # the interval of the change excludes the allowed −5
    # the paired interval is the narrower one (the two runs share their points)
    w = [next(c for c in compare(o, d, gates) if c.key == "pgd_linf@0.1").delta_ci for o, d in (
        (old, _report(int(dropped.sum()), n)), (paired_old, _report(int(dropped.sum()), n, outcomes=dropped)))]
    assert w[1][1] - w[1][0] < 0.7 * (w[0][1] - w[0][0])
    # a drop of exactly 5 points is not past a −5 gate: its interval reaches −5
    five = base.copy()
    five[rng.choice(np.flatnonzero(base), size=n // 20, replace=False)] = False
    assert not any(c.gated for c in compare(old, _report(int(five.sum()), n), gates))
    # a rise in privacy risk past +2 points is gated too; a 1-point wiggle is not
    assert any(c.gated == "privacy:+2" for c in compare(old, _report(int(base.sum()), n, tpr_k=20), gates))
    assert not any(c.gated for c in compare(old, _report(int(base.sum()), n, tpr_k=6), gates))


def test_fail_on_is_checked() -> None:
    with pytest.raises(ConfigError, match="SECTION:"):
        parse_fail_on("robustness:5")
    with pytest.raises(ConfigError, match="no metrics for section"):
        compare(_report(10, 20), _report(10, 20), parse_fail_on("robustnes:-5"))


def test_bom_is_valid_cyclonedx(tmp_path: Path) -> None:
    pytest.importorskip("cyclonedx", reason="cyclonedx-python-lib is not installed (modelward[bom])")
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    from modelward.assess.bom import write_bom

    (tmp_path / "w.safetensors").write_bytes(b"x")
    report = {"name": "m", "model": "mlp", "profile": "quick", "config": {"seed": 0, "checkpoint":
              str(tmp_path / "w.safetensors"), "data": {"source": "digits"}}, "clean_accuracy": 0.9,
              "findings": _report(150, 200)["findings"], "versions": {"torch": "2.13.0", "python": "3.11"}}
    path = write_bom(tmp_path, report)
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(path.read_text()) is None
    bom = json.loads(path.read_text())
    assert bom["metadata"]["component"]["type"] == "machine-learning-model"
    import hashlib

    assert bom["metadata"]["component"]["hashes"][0]["content"] == hashlib.sha256(b"x").hexdigest()
