"""Hardness tables from hand-made run results: multi-task averaging within a seed, filtering, the infimum."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from modelward.completion.problem import CompletionProblem, OriginalRun
from modelward.completion.report import compute_tables, markdown
from modelward.completion.study import StudyConfig, orig_id, retrain_id


class TwoGames(CompletionProblem):
    tasks = ["pong", "maze", "breakout"]

    def part_names(self) -> list[str]:
        return ["conv1"]

    def parts_table(self) -> list[dict[str, Any]]:
        return []

    def train_original(self, seed, task, workdir, on_eval=None):  # pragma: no cover - not run here
        raise NotImplementedError

    def retrain(self, *a, **k):  # pragma: no cover - not run here
        raise NotImplementedError

    def random_loss(self, task: str) -> float:
        return -1.0

    def usable(self, original: OriginalRun) -> bool:
        return original.best < self.random_loss(original.task)


def _results() -> dict[str, dict[str, Any]]:
    res: dict[str, dict[str, Any]] = {}
    orig = {"pong": [(0, 0.0), (100, -5.0), (200, -10.0)], "maze": [(0, 0.0), (100, -0.5), (200, -0.9)],
            "breakout": [(0, 0.0), (200, -10.0)]}
    for seed in (0, 1):
        for task, curve in orig.items():
            res[orig_id(task, seed)] = {"kind": "orig", "task": task, "seed": seed, "curve": curve,
                                        "checkpoint": "x"}
    # pong: C(ℓ*_1) = 200. seed 0 reaches -10 at 50 (0.25) and T2 never (1.0); seed 1 reaches it at 150 (0.75)
    for seed, t1, t2 in ((0, [(0, 0.0), (50, -10.0)], [(0, 0.0), (200, -9.0)]),
                         (1, [(0, 0.0), (150, -10.0)], [(0, 0.0), (100, -10.0)])):
        for proc, curve in (("T1", t1), ("T2", t2)):
            res[retrain_id("pong", seed, "conv1", proc)] = {"kind": "re", "task": "pong", "seed": seed,
                                                            "part": "conv1", "procedure": proc, "curve": curve}
            # maze never beats random (-0.9 > -1): filtered, its (terrible) ratios must not count
            res[retrain_id("maze", seed, "conv1", proc)] = {"kind": "re", "task": "maze", "seed": seed,
                                                            "part": "conv1", "procedure": proc,
                                                            "curve": [(0, 0.0), (200, 0.0)]}
            # breakout: every retraining reaches ℓ* at 100 of 200 steps (0.5)
            res[retrain_id("breakout", seed, "conv1", proc)] = {"kind": "re", "task": "breakout", "seed": seed,
                                                                "part": "conv1", "procedure": proc,
                                                                "curve": [(0, 0.0), (100, -10.0)]}
    return res


def test_multi_task_filtering_averaging_and_infimum():
    cfg = StudyConfig.model_validate({"kind": "rl", "rl": {}, "seeds": [0, 1], "alphas": [1.0],
                                      "procedures": [{"name": "T1", "kind": "T1"}, {"name": "T2", "kind": "T2"}]})
    t = compute_tables(cfg, TwoGames(), _results(), Path("."))
    rows = {(r["procedure"], r["alpha"]): r for r in t.rows}
    # per seed: mean over the usable games (pong, breakout); then statistics over seeds
    t1 = rows[("T1", 1.0)]
    assert (t1["min"], t1["max"], t1["n"]) == (pytest.approx(0.375), pytest.approx(0.625), 2)
    assert t1["sd"] == pytest.approx(0.1767767, abs=1e-6)
    assert rows[("T2", 1.0)]["mean"] == pytest.approx(((1.0 + 0.5) / 2 + (0.5 + 0.5) / 2) / 2)
    assert rows[("T2", 1.0)]["not_reached"] == 1
    # T1 (0.375, 0.625) beats T2 (0.75, 0.5) by 0.125 on average; the paired differences (0.375, −0.125) have
    # SD 0.354, so the margin is 0.35 SD: the minimum may be noise
    (inf,) = t.inf_rows
    assert (inf["part"], inf["group"], inf["procedure"], inf["runner_up"]) == ("conv1", "all", "T1", "T2")
    assert inf["value"] == pytest.approx(0.5) and inf["margin"] == pytest.approx(0.125)
    assert inf["margin_in_sd"] == pytest.approx(0.125 / 0.3535534, abs=1e-6) and inf["n_paired"] == 2
    assert sorted(t.filtered) == ["maze seed 0", "maze seed 1"]
    by_task = {(r["task"], r["procedure"]): r for r in t.task_rows}
    assert (by_task[("pong", "T1")]["min"], by_task[("pong", "T1")]["max"]) == (pytest.approx(0.25), pytest.approx(0.75))
    assert by_task[("breakout", "T1")]["mean"] == pytest.approx(0.5) and ("maze", "T1") not in by_task
    md = markdown(cfg, t)
    assert "L(random)" in md and "filtered: no better than the random policy" in md


def test_retraining_of_a_filtered_task_is_skipped(tmp_path, monkeypatch):
    """A task whose original is filtered out gets no retraining: its runs are recorded as skipped, not run."""
    from modelward.completion.study import run_study
    from modelward.completion.supervised import SupervisedProblem
    from modelward.core.ledger import RunLedger

    monkeypatch.setattr(SupervisedProblem, "usable", lambda self, run: False, raising=False)
    cfg = StudyConfig.model_validate({"data": {"source": "iris"}, "model": {"arch": "mlp", "hidden": [4]},
                                      "train": {"steps": 10, "eval_every": 5}, "seeds": [0],
                                      "parts": ["logits"], "procedures": [{"name": "T1", "kind": "T1"}]})
    run_study(cfg, tmp_path, workers=1)
    results = RunLedger(tmp_path / "ledger.sqlite").results()
    re = next(v for k, v in results.items() if k.startswith("re|"))
    assert "skipped" in re and "curve" not in re
    assert "filtered" in (tmp_path / "hardness.md").read_text()


class OneModel(CompletionProblem):
    tasks = [""]

    def part_names(self) -> list[str]:
        return ["conv1"]

    def parts_table(self) -> list[dict[str, Any]]:
        return []

    def train_original(self, seed, task, workdir, on_eval=None):  # pragma: no cover - not run here
        raise NotImplementedError

    def retrain(self, *a, **k):  # pragma: no cover - not run here
        raise NotImplementedError


def test_capped_uncapped_reference_threat_groups_and_quantisation():
    """ℓ* = 0.2 reached at step 30 (3 evaluations): T0 = from scratch, T1 with the buffer kept and reset."""
    cfg = StudyConfig.model_validate({"kind": "rl", "rl": {"eval_every": 10}, "seeds": [0, 1, 2], "alphas": [1.0],
                                      "procedures": [{"name": "kept", "kind": "T1", "keep_buffer": True},
                                                     {"name": "reset", "kind": "T1", "keep_buffer": False}]})
    res: dict[str, dict[str, Any]] = {}
    reach = {"T0": [30, 45, None], "kept": [10, 20, 10], "reset": [30, 30, 40]}
    for seed in (0, 1, 2):
        res[orig_id("", seed)] = {"kind": "orig", "task": "", "seed": seed, "checkpoint": "x",
                                  "curve": [(0, 1.0), (10, 0.8), (20, 0.5), (30, 0.2)]}
        for proc, costs in reach.items():
            c = costs[seed]
            curve = [(0, 1.0), (60, 0.9)] if c is None else [(0, 1.0), (c, 0.2)]
            part = "(all)" if proc == "T0" else "conv1"
            res[retrain_id("", seed, part, proc)] = {"kind": "re", "task": "", "seed": seed, "part": part,
                                                     "procedure": proc, "curve": curve, "budget": 60}
    t = compute_tables(cfg, OneModel(), res, Path("."))
    rows = {r["procedure"]: r for r in t.rows}
    t0 = rows["T0"]
    assert t0["part"] == "(all)" and t0["mean"] == 1.0 and (t0["capped"], t0["not_reached"]) == (1, 1)
    assert t0["mean_uncapped"] == pytest.approx((1.0 + 1.5 + 2.0) / 3)  # never reached: budget/C = 60/30
    assert rows["reset"]["mean"] == 1.0 and rows["reset"]["max_uncapped"] == pytest.approx(40 / 30)
    infs = {r["group"]: r for r in t.inf_rows}
    assert set(infs) == {"kept", "reset"}  # one infimum per threat model, T0 a candidate in each
    assert infs["kept"]["procedure"] == "kept" and infs["kept"]["runner_up"] == "T0"
    assert infs["kept"]["margin"] == pytest.approx(1.0 - 4 / 9)
    assert infs["kept"]["margin_in_sd"] == pytest.approx((1.0 - 4 / 9) / 0.19245009, abs=1e-5)
    assert infs["reset"]["value"] == 1.0
    assert len(t.warnings) == 1 and "eval_every ≤ 6" in t.warnings[0]  # C = 30 after 3 evaluations
    md = markdown(cfg, t)
    assert "uncapped 1.50 ± 0.50 (1 capped, 1 not reached)" in md and "inf (Eq. 1), buffer kept" in md
    assert "**Reference** T0 (from scratch" in md and "Capped" in md and "Quantised" in md
