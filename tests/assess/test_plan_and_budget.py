"""Time that is visible: every section announces its planned work and an estimate before it starts, and its progress
names the attack, ε and points (to the command's sink and to progress.log); the quick profile's compute budget cuts
points of large models only, down to stated floors, never the counts a config sets."""

from __future__ import annotations

from dataclasses import replace

import pytest
from torch import nn

from modelward.assess import AssessConfig, run_assessment
from modelward.assess.profiles import BUDGET_FLOORS, PROFILES
from modelward.assess.sections.common import Work, fit_budget, forward_flops
from modelward.core.progress import RecordingProgress


def _plan(sz):  # noqa: ANN001, ANN202 - a robustness-like plan: attacked points × steps, C&W points × steps
    return [Work("PGD", sz.n_eval, 10, 6), Work("C&W", sz.cw_points, 4 * sz.cw_steps)]


def test_the_budget_cuts_large_models_to_their_floors_and_keeps_small_ones():
    quick = PROFILES["quick"]
    floors = BUDGET_FLOORS["robustness"]
    same, works, note = fit_budget("robustness", quick, {}, _plan, 1e3, floors)  # a tiny model: all of it
    assert same == quick and note == ""
    cut, works, note = fit_budget("robustness", quick, {}, _plan, 2.2e8, floors)  # a ResNet-18 on 32×32
    assert cut.n_eval < quick.n_eval and cut.n_eval >= floors["n_eval"]
    assert sum(w.units for w in works) * 2.2e8 <= 1.0e12 or cut.n_eval == floors["n_eval"]
    assert "quick profile: n_eval 200 →" in note and "--profile standard" in note
    kept, _, note = fit_budget("robustness", quick, {"n_eval": 200}, _plan, 2.2e8, floors)  # set in [sizes]
    assert kept.n_eval == 200 and "n_eval" not in note
    huge, _, note = fit_budget("robustness", quick, {}, _plan, 1e12, floors)
    assert (huge.n_eval, huge.cw_points, huge.cw_steps) == (30, 10, 25) and "the floors reached" in note
    assert fit_budget("robustness", replace(quick, budget_tflop=None), {}, _plan, 1e12, floors)[0] == replace(
        quick, budget_tflop=None)  # standard and thorough: no budget


def test_forward_flops_counts_the_model():
    assert forward_flops(nn.Linear(100, 10), __import__("torch").zeros(1, 100)) == pytest.approx(2 * 100 * 10, rel=0.2)


def test_every_section_announces_its_plan_and_names_attack_eps_and_points(tmp_path):
    # a shipped factory (no trust switch needed), untrained: the plan and the progress are what is checked
    cfg = AssessConfig.model_validate({
        "model": {"arch": "entrypoint", "entrypoint": "modelward.cost.models:square_mlp", "kwargs": {"hidden": [8]}},
        "data": {"source": "synthetic_tabular", "n_samples": 300, "n_features": 6, "num_classes": 2},
        "sections": ["robustness", "explanations"],
        "sizes": {"n_eval": 20, "cw_points": 4, "cw_steps": 5, "explain_points": 10}})
    rec = RecordingProgress()
    run_assessment(cfg, tmp_path / "out", rec)
    starts = {e[1]: e[3] for e in rec.events if e[0] == "start"}
    assert {"robustness", "explanations"} <= set(starts)
    plans = [e[3] for e in rec.events if e[0] == "advance" and e[3].startswith("planned:")]
    assert len(plans) == 2 and all("point-gradients" in p and "measured here" in p for p in plans)
    infos = [e[3] for e in rec.events if e[0] == "advance" and e[1] == "robustness"]
    assert any(i.startswith("PGD L∞ ε = ") and "20 points" in i for i in infos)
    log = (tmp_path / "out" / "progress.log").read_text()
    assert "robustness: start" in log and "planned:" in log and "explanations: done" in log
