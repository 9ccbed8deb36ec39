"""One run of a completion study (in the driver process or a worker): train the original, or reset a part and
retrain it, write the run's curve and JSON into the study folder, and return the result the ledger records."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from modelward.completion.config import StudyConfig
from modelward.completion.metric import Thresholds
from modelward.completion.plan import is_usable, make_problem, orig_id, run_file_stem
from modelward.completion.problem import CompletionProblem, Curve, OriginalRun
from modelward.core.io import load_state_dict
from modelward.core.ledger import RunLedger
from modelward.core.records import atomic_write_text, write_csv
from modelward.core.runner import DamagedDependency
from modelward.errors import DataError, ModelwardError

_PROBLEMS: dict[str, CompletionProblem] = {}


def problem_for(cfg_json: str, problem: CompletionProblem | None = None) -> tuple[StudyConfig, CompletionProblem]:
    """The study config and its problem (the given one, or built once per process from the config)."""
    cfg = StudyConfig.model_validate_json(cfg_json)
    if problem is not None:
        return cfg, problem
    if cfg_json not in _PROBLEMS:
        _PROBLEMS[cfg_json] = make_problem(cfg)
    return cfg, _PROBLEMS[cfg_json]


def write_curve(path: Path, curve: Curve) -> None:
    """A run's learning curve as ``cost,loss`` CSV."""
    write_csv(path, [{"cost": c, "loss": v} for c, v in curve], ["cost", "loss"])


def original_from_result(out: Path, result: dict[str, Any]) -> OriginalRun:
    """The :class:`OriginalRun` an ``orig`` result describes (checkpoint paths are relative to the folder)."""
    return OriginalRun(result["seed"], result["task"], [tuple(p) for p in result["curve"]],
                       out / result["checkpoint"], result.get("extras", {}))


def _write_run(out: Path, run_id: str, result: dict[str, Any], curve: Curve) -> None:
    stem = run_file_stem(run_id)
    write_curve(out / "curves" / f"{stem}.csv", curve)
    atomic_write_text(out / "runs" / f"{stem}.json", json.dumps({"run_id": run_id, **result}))


def store_original(out: Path, run: OriginalRun) -> dict[str, Any]:
    """Write a finished original run's curve and JSON; returns its ledger result."""
    rid = orig_id(run.task, run.seed)
    # stored relative to the study folder, so the folder can be moved; resolve() makes cwd-relative paths safe
    rel = os.path.relpath(Path(run.checkpoint).resolve(), Path(out).resolve())
    result = {"kind": "orig", "task": run.task, "seed": run.seed, "curve": [list(p) for p in run.curve],
              "checkpoint": rel, "extras": run.extras}
    _write_run(out, rid, result, run.curve)
    return result


def record_original(out: Path, ledger: RunLedger, run: OriginalRun) -> dict[str, Any]:
    """Store a finished original run (curve CSV + run JSON + ledger) — used to inject a preset original."""
    result = store_original(out, run)
    ledger.finish(orig_id(run.task, run.seed), result)
    return result


def _check_original(run_id: str, original: OriginalRun) -> None:
    """The original's checkpoint must be readable: a damaged one is re-created (the runner re-runs the original)
    instead of failing every retraining on every re-run."""
    path = Path(original.checkpoint)
    if not path.is_file():
        raise DamagedDependency(run_id, f"{path}: checkpoint missing")
    try:
        load_state_dict(path)
    except DataError as e:
        raise DamagedDependency(run_id, str(e)) from None


def execute_run(cfg_json: str, out_dir: str, problem: CompletionProblem | None, run_id: str, spec: dict[str, Any],
                dep_results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Execute one planned run (the ``execute`` of :func:`modelward.core.runner.run_plan`); returns its result.

    ``orig`` runs train from scratch; ``re`` runs reset one part of their original (``dep_results``) and retrain
    it within the budget, stopping early at the highest-α threshold. A task whose original is unusable (no
    better than untrained/random) is recorded as skipped without retraining.
    """
    out = Path(out_dir).resolve()
    cfg, problem = problem_for(cfg_json, problem)
    t0 = time.perf_counter()
    workdir = out / "checkpoints"
    workdir.mkdir(parents=True, exist_ok=True)
    if spec["kind"] == "orig":
        run = problem.train_original(spec["seed"], spec["task"], workdir)
        if not run.curve or run.curve[0][0] != 0:
            raise ModelwardError(f"{run_id}: the original curve must start at cost 0")
        return store_original(out, run)
    orig_res = dep_results.get(orig_id(spec["task"], spec["seed"]))
    if orig_res is None:
        raise ModelwardError(f"{run_id}: its original run is not finished")
    original = original_from_result(out, orig_res)
    _check_original(orig_id(spec["task"], spec["seed"]), original)
    thr = Thresholds.from_curve(original.curve, cfg.alphas, cfg.thresholds.smoothing)
    task_originals = [original_from_result(out, r) for rid, r in sorted(dep_results.items())
                      if rid.startswith("orig|") and r.get("task") == spec["task"]]
    if not is_usable(problem, original, thr, task_originals):
        # the task is filtered out of every table: do not spend a retraining on it
        return {**spec, "skipped": "original no better than untrained/random"}
    budget = cfg.budget or original.steps
    stop_at = thr.values[max(cfg.alphas)] if cfg.early_stop else None
    proc = next(p for p in cfg.all_procedures if p.name == spec["procedure"])
    curve = problem.retrain(original, spec["part"], proc, spec["seed"], budget, stop_at, workdir)
    curve = [(int(c), float(v)) for c, v in curve]
    result = {**spec, "curve": [list(p) for p in curve], "budget": budget, "seconds": time.perf_counter() - t0}
    _write_run(out, run_id, result, curve)
    return result
