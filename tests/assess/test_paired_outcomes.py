"""Issue 38 (findings3): the robustness section stores each threat metric's per-point outcomes and the id of its
points (a SHA-256 of the evaluated inputs and labels); `assess diff` of two real reports uses Newcombe's paired
interval when both ran on the very same points and the unpaired one otherwise, and says which."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from modelward.assess import AssessConfig, run_assessment
from modelward.assess.diff import compare, parse_fail_on
from modelward.assess.outcomes import pack_outcomes, paired_cells, points_id, unpack_outcomes
from modelward.core.stats import newcombe, newcombe_paired
from modelward.robustness.metrics import robust_accuracy


def _assess(out: Path, seed: int = 0, data_seed: int = 0) -> dict:
    # a shipped factory (no trust switch needed), untrained: what is checked is what the report stores
    cfg = AssessConfig.model_validate({
        "seed": seed,
        "model": {"arch": "entrypoint", "entrypoint": "modelward.cost.models:square_mlp", "kwargs": {"hidden": [8]}},
        "data": {"source": "synthetic_tabular", "n_samples": 300, "n_features": 6, "num_classes": 2,
                 "seed": data_seed},
        "sections": ["robustness"], "sizes": {"n_eval": 24, "cw_points": 8, "cw_steps": 5, "pgd_steps": 3}})
    run_assessment(cfg, out)
    return json.loads((out / "report.json").read_text())


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("paired")
    return {"a": _assess(root / "a"), "again": _assess(root / "again", seed=1),
            "other_points": _assess(root / "other", data_seed=1)}


def _threats(report: dict) -> dict[str, dict]:
    sec = next(s for s in report["sections"] if s["section"] == "robustness")
    assert sec["status"] == "assessed", sec.get("reason")
    return {m["key"]: m for m in sec["metrics"] if m["context"].get("threat")}


def test_every_threat_metric_stores_outcomes_consistent_with_its_count(reports: dict[str, dict]) -> None:
    threats = _threats(reports["a"])
    assert {k.split("@")[0] for k in threats} >= {"fgsm_linf", "pgd_linf", "fgsm_l2", "pgd_l2", "cw_l2",
                                                  "autoattack_linf", "autoattack_l2"}
    for key, m in threats.items():
        pts = m["context"]["points"]
        assert pts["n"] == m["n"] and len(pts["sha256"]) == 64, key
        flags = unpack_outcomes(m["context"]["outcomes"], m["n"])
        assert flags is not None and int(flags.sum()) == m["k"], key
        assert m["value"] == pytest.approx(m["k"] / m["n"]), key
    assert threats["cw_l2@" + next(k for k in threats if k.startswith("cw_l2")).split("@")[1]]["n"] == 8
    assert len(reports["a"]["sections"][0]["metrics"][0]["context"].get("outcomes", "")) < 100  # compact


def test_stored_outcomes_are_the_attack_robust_accuracy_computes() -> None:
    """The section's per-point sweep replaced robust_accuracy: the same attack, seed and points give its value."""
    from modelward.assess.sections.robustness import _sweep

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).eval()
    x, y = torch.randn(40, 6), torch.randint(3, (40,))
    for name in ("fgsm", "pgd"):
        params = {"norm": "linf", "clip": (-3.0, 3.0)} | ({"seed": 5, "steps": 4} if name == "pgd" else {})
        accs, flags = _sweep(model, x, y, name, "linf", [0.1, 0.3], 4, (-3.0, 3.0), 5)
        ref = [p.robust_accuracy for p in robust_accuracy(model, x, y, name, [0.1, 0.3], params)]
        assert accs == pytest.approx(ref) and [float(f.float().mean()) for f in flags] == pytest.approx(ref)


def test_same_points_are_paired_other_points_and_tampered_ids_are_not(reports: dict[str, dict]) -> None:
    a, again, other = reports["a"], reports["again"], reports["other_points"]
    gates = parse_fail_on("robustness:-5")
    # the same points (another attack seed): every threat metric with stored outcomes is paired
    same = {c.key: c for c in compare(a, again, gates) if c.key in _threats(a)}
    assert same and all(c.interval.startswith("paired Newcombe: same ") for c in same.values())
    for key, c in same.items():
        cells, _ = paired_cells(_threats(a)[key], _threats(again)[key])
        assert cells is not None
        assert c.delta_ci == pytest.approx([100 * v for v in newcombe_paired(*cells)])
    # other points of the same size and the same row numbers (the data split with another seed): unpaired
    diff = {c.key: c for c in compare(a, other, gates) if c.key in _threats(a)}
    assert all(c.interval.startswith("unpaired Newcombe: different points") for c in diff.values())
    m1, m2 = _threats(a)["pgd_linf@0.1"], _threats(other)["pgd_linf@0.1"]
    assert m1["context"]["points"]["indices"] == m2["context"]["points"]["indices"]
    assert diff["pgd_linf@0.1"].delta_ci == pytest.approx([100 * v for v in newcombe(m1["k"], m1["n"], m2["k"],
                                                                                      m2["n"])])
    # a tampered id (a report edited to claim the other's points) or tampered outcomes: unpaired
    forged = json.loads(json.dumps(again))
    _threats(forged)["pgd_linf@0.1"]["context"]["points"]["sha256"] = "0" * 64
    flags = unpack_outcomes(_threats(forged)["pgd_l2@" + _l2(forged)]["context"]["outcomes"], 24)
    assert flags is not None
    flags[0] = not flags[0]  # one point's outcome changed without its count
    _threats(forged)["pgd_l2@" + _l2(forged)]["context"]["outcomes"] = pack_outcomes(flags)
    by = {c.key: c for c in compare(a, forged, gates)}
    assert by["pgd_linf@0.1"].interval.startswith("unpaired Newcombe: different points")
    assert by["pgd_l2@" + _l2(forged)].interval == ("unpaired Newcombe: per-point outcomes inconsistent with the "
                                                   "metric's own k of n")
    assert by["fgsm_linf@0.1"].interval.startswith("paired")  # the untouched ones stay paired


def _l2(report: dict) -> str:
    return next(k for k in _threats(report) if k.startswith("pgd_l2@")).split("@")[1]


def test_points_id_and_bitset() -> None:
    x, y = torch.rand(10, 3), torch.arange(10) % 2
    assert points_id(x, y) == points_id(x.clone(), y.clone())
    assert points_id(x, y)["sha256"] != points_id(x, 1 - y)["sha256"]  # the labels count
    x2 = x.clone()
    x2[3, 1] = torch.nextafter(x2[3, 1], torch.tensor(2.0))  # one ulp of one input
    assert points_id(x, y)["sha256"] != points_id(x2, y)["sha256"]
    flags = np.random.default_rng(0).random(13) < 0.5
    bits = pack_outcomes(flags)
    assert len(bits) == 4 and (unpack_outcomes(bits, 13) == flags).all()
    assert unpack_outcomes(bits, 17) is None and unpack_outcomes("zz" + bits[2:], 13) is None  # length, not hex
    assert unpack_outcomes(bits[:-1] + "f", 13) is None  # padding bits set
