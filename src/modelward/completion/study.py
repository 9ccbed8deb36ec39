"""A completion study = original training × parts × procedures × seeds (× tasks), run through the SQLite ledger.

Runs: one ``orig`` run per (task, seed) — its own original training (seed 000: each seed repeats the whole
experiment) — and one ``re`` run per (task, seed, part, procedure). Each run records its curve; MC-hardness is
computed from the curves afterwards (``modelward.completion.report``), so tables can always be rebuilt from the
run files. Interrupting (Ctrl-C, kill -9) and re-running the same command keeps finished runs and restarts the
others. ``workers`` > 1 runs runs in parallel processes.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import time
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from rich.console import Console

from modelward.completion.metric import Thresholds
from modelward.completion.problem import CompletionProblem, OriginalRun, ProcedureSpec
from modelward.core.config import StrictModel, dump_config, load_config
from modelward.core.data import DataConfig
from modelward.core.ledger import RunLedger
from modelward.core.progress import make_progress
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig
from modelward.errors import ConfigError, ModelwardError


class RetrainConfig(StrictModel):
    """Retraining schedule overrides (the paper's SL retraining schedule is 50% faster, App. A Tables 1–2)."""

    lr: float | None = Field(None, gt=0.0)
    lr_schedule: list[tuple[int, float]] | None = None


def _default_procedures() -> list[ProcedureSpec]:
    return [ProcedureSpec(name="T1", kind="T1"), ProcedureSpec(name="T2", kind="T2")]


class StudyConfig(StrictModel):
    """A completion study file (see examples/completion_*.toml)."""

    name: str = "study"
    kind: Literal["supervised", "rl"] = "supervised"
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    alphas: list[float] = Field(default_factory=lambda: [0.5, 0.8, 0.9, 1.0], min_length=1)
    parts: list[str] = Field(default_factory=list)  # empty = the model's natural parts
    procedures: list[ProcedureSpec] = Field(default_factory=_default_procedures, min_length=1)
    budget: int | None = Field(None, ge=1)  # retraining budget in cost units; None = original training length
    early_stop: bool = True  # stop retraining once the highest-α threshold is reached
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    retrain: RetrainConfig = Field(default_factory=RetrainConfig)
    rl: dict[str, Any] | None = None  # validated by the RL problem (modelward.rl.completion)

    @field_validator("alphas")
    @classmethod
    def _alphas(cls, v: list[float]) -> list[float]:
        if any(not 0.0 <= a <= 1.0 for a in v):
            raise ValueError("every alpha must be in [0, 1]")
        if len(set(v)) != len(v):
            raise ValueError("alphas must be distinct")
        return sorted(v)

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError("seeds must be distinct")
        return v

    @model_validator(mode="after")
    def _check(self) -> StudyConfig:
        names = [p.name for p in self.procedures]
        if len(set(names)) != len(names):
            raise ValueError(f"procedure names must be distinct, got {names}")
        for p in self.procedures:
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", p.name):
                raise ValueError(f"procedure name {p.name!r}: use letters, digits, '_', '.', '-'")
        if self.kind == "rl" and self.rl is None:
            raise ValueError("kind='rl' needs an [rl] table (environment, agent, steps; see examples/)")
        return self


def load_study(path: str | Path, overrides: list[str] | None = None) -> StudyConfig:
    """Load a study file; an empty file is refused (it would silently run the whole default study)."""
    from modelward.core.config import read_toml

    if not read_toml(path):
        raise ConfigError(f"{path}: the study file is empty; see examples/completion_digits.toml")
    return load_config(path, StudyConfig, overrides)


def make_problem(cfg: StudyConfig) -> CompletionProblem:
    """The learning problem behind a study: supervised (zoo model on a data set) or RL (modelward.rl)."""
    if cfg.kind == "supervised":
        from modelward.completion.supervised import SupervisedProblem

        return SupervisedProblem(cfg.data, cfg.model, cfg.train, cfg.retrain.lr, cfg.retrain.lr_schedule)
    try:
        from modelward.rl.completion import RLProblem
    except ImportError as e:  # pragma: no cover - depends on the RL area being installed
        raise ConfigError(f"kind='rl': the RL completion problem is unavailable ({e})") from None
    return RLProblem.from_study(cfg)


# -- run identities -----------------------------------------------------------------------------------------
def orig_id(task: str, seed: int) -> str:
    return f"orig|{task}|{seed}"


def retrain_id(task: str, seed: int, part: str, proc: str) -> str:
    return f"re|{task}|{seed}|{part}|{proc}"


def run_file_stem(run_id: str) -> str:
    """A file-system-safe, unique name for a run id."""
    readable = re.sub(r"[^A-Za-z0-9_.+-]+", "_", run_id.replace("|", "__"))[:80]
    return f"{readable}-{hashlib.sha1(run_id.encode()).hexdigest()[:8]}"


def study_parts(cfg: StudyConfig, problem: CompletionProblem) -> list[str]:
    parts = cfg.parts or problem.part_names()
    for p in parts:
        problem.validate_part(p)
    return parts


def plan(cfg: StudyConfig, problem: CompletionProblem) -> list[tuple[str, dict[str, Any]]]:
    runs: list[tuple[str, dict[str, Any]]] = []
    parts = study_parts(cfg, problem)
    for task in problem.tasks:
        for seed in cfg.seeds:
            runs.append((orig_id(task, seed), {"kind": "orig", "task": task, "seed": seed}))
            for part in parts:
                for proc in cfg.procedures:
                    runs.append((retrain_id(task, seed, part, proc.name),
                                 {"kind": "re", "task": task, "seed": seed, "part": part, "procedure": proc.name}))
    return runs


def config_fingerprint(cfg: StudyConfig) -> str:
    return hashlib.sha256(cfg.model_dump_json().encode()).hexdigest()


# -- executing one run (in this process or a worker) -------------------------------------------------------
_PROBLEMS: dict[str, CompletionProblem] = {}


def _problem_for(cfg_json: str) -> tuple[StudyConfig, CompletionProblem]:
    cfg = StudyConfig.model_validate_json(cfg_json)
    if cfg_json not in _PROBLEMS:
        _PROBLEMS[cfg_json] = make_problem(cfg)
    return cfg, _PROBLEMS[cfg_json]


def is_usable(problem: CompletionProblem, original: OriginalRun, thr: Thresholds) -> bool:
    """Whether a task's original run counts: the problem's ``usable`` hook (RL: better than a random policy), or
    else whether training improved on the untrained model at all."""
    hook = getattr(problem, "usable", None)
    return bool(hook(original)) if callable(hook) else thr.learned


def write_curve(path: Path, curve: list[tuple[int, float]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["cost", "loss"])
        w.writerows(curve)
    os.replace(tmp, path)


def original_from_result(out: Path, result: dict[str, Any]) -> OriginalRun:
    return OriginalRun(result["seed"], result["task"], [tuple(p) for p in result["curve"]],
                       out / result["checkpoint"], result.get("extras", {}))


def record_original(out: Path, ledger: RunLedger, run: OriginalRun) -> dict[str, Any]:
    """Store a finished original run (curve CSV + run JSON + ledger) — also used to inject a preset original."""
    rid = orig_id(run.task, run.seed)
    # stored relative to the study folder, so the folder can be moved; resolve() makes cwd-relative paths safe
    rel = os.path.relpath(Path(run.checkpoint).resolve(), Path(out).resolve())
    result = {"kind": "orig", "task": run.task, "seed": run.seed, "curve": [list(p) for p in run.curve],
              "checkpoint": rel, "extras": run.extras}
    stem = run_file_stem(rid)
    write_curve(out / "curves" / f"{stem}.csv", run.curve)
    (out / "runs").mkdir(exist_ok=True)
    (out / "runs" / f"{stem}.json").write_text(json.dumps({"run_id": rid, **result}))
    ledger.finish(rid, result)
    return result


def execute_run(cfg_json: str, out_dir: str, run_id: str) -> str:
    """Run one study run end to end and record it in the ledger. Returns the run id (for the scheduler)."""
    import torch

    if os.environ.get("MODELWARD_WORKER") == "1":
        torch.set_num_threads(1)
    out = Path(out_dir).resolve()
    ledger = RunLedger(out / "ledger.sqlite")
    cfg, problem = _problem_for(cfg_json)
    spec = ledger.spec(run_id)
    if not ledger.start(run_id):
        return run_id  # finished or claimed meanwhile
    t0 = time.perf_counter()
    try:
        workdir = out / "checkpoints"
        workdir.mkdir(parents=True, exist_ok=True)
        if spec["kind"] == "orig":
            run = problem.train_original(spec["seed"], spec["task"], workdir)
            if not run.curve or run.curve[0][0] != 0:
                raise ModelwardError(f"{run_id}: the original curve must start at cost 0")
            record_original(out, ledger, run)
            return run_id
        orig_res = ledger.results().get(orig_id(spec["task"], spec["seed"]))
        if orig_res is None:
            raise ModelwardError(f"{run_id}: its original run is not finished")
        original = original_from_result(out, orig_res)
        thr = Thresholds.from_curve(original.curve, cfg.alphas)
        if not is_usable(problem, original, thr):
            # the task is filtered out of every table: do not spend a retraining on it
            ledger.finish(run_id, {**spec, "skipped": "original no better than untrained/random"})
            return run_id
        budget = cfg.budget or original.steps
        stop_at = thr.values[max(cfg.alphas)] if cfg.early_stop else None
        proc = next(p for p in cfg.procedures if p.name == spec["procedure"])
        curve = problem.retrain(original, spec["part"], proc, spec["seed"], budget, stop_at, workdir)
        curve = [(int(c), float(v)) for c, v in curve]
        stem = run_file_stem(run_id)
        write_curve(out / "curves" / f"{stem}.csv", curve)
        result = {**spec, "curve": [list(p) for p in curve], "budget": budget, "seconds": time.perf_counter() - t0}
        (out / "runs" ).mkdir(exist_ok=True)
        (out / "runs" / f"{stem}.json").write_text(json.dumps({"run_id": run_id, **result}))
        ledger.finish(run_id, result)
        return run_id
    except BaseException as e:
        ledger.fail(run_id, "".join(traceback.format_exception(e)))
        raise


# -- the study ------------------------------------------------------------------------------------------------
@dataclass
class StudyOutcome:
    out: Path
    done: int
    total: int
    failed: dict[str, str]


def _worker_init() -> None:
    os.environ["MODELWARD_WORKER"] = "1"


def run_study(cfg: StudyConfig, out: str | Path, workers: int | None = None, console: Console | None = None,
              preset_originals: list[OriginalRun] | None = None,
              on_progress: Callable[[dict[str, dict[str, Any]]], str] | None = None) -> StudyOutcome:
    """Run (or resume) the study in `out`. `preset_originals` inject already-trained original runs (e.g. a model
    trained split between parties); their seeds' retraining runs start from them."""
    from modelward.completion.report import live_estimate, write_report

    console = console or Console()
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    problem = make_problem(cfg)
    runs = plan(cfg, problem)
    ledger = RunLedger(out / "ledger.sqlite")
    ledger.check_meta("config", config_fingerprint(cfg))
    dump_config(cfg, out / "study.json")
    for rid, spec in runs:
        ledger.add(rid, spec)
    recovered = ledger.recover()
    if recovered:
        console.print(f"[yellow]resuming:[/] {recovered} interrupted run(s) will restart")
    for run in preset_originals or []:
        rid = orig_id(run.task, run.seed)
        if ledger.status(rid) != "done" and ledger.start(rid, "preset"):
            record_original(out, ledger, run)
    cfg_json = cfg.model_dump_json()
    workers = max(1, workers or os.cpu_count() or 1)
    specs = dict(runs)
    total = len(runs)

    def ready(pending: set[str], done: set[str]) -> list[str]:
        out_ids = []
        for rid in sorted(pending):
            s = specs[rid]
            if s["kind"] == "orig" or orig_id(s["task"], s["seed"]) in done:
                out_ids.append(rid)
        # originals first: they unlock the most work
        return sorted(out_ids, key=lambda r: (not r.startswith("orig|"), r))

    results = ledger.results()
    done = set(results)
    pending = {rid for rid, _ in runs if rid not in done}
    failed: dict[str, str] = {}
    estimate = live_estimate(cfg, problem, results) if on_progress is None else on_progress(results)
    with make_progress(console) as progress:
        task = progress.add_task(f"study {cfg.name}", total=total, completed=len(done), info=estimate)

        def refresh() -> None:
            nonlocal results
            results = ledger.results()
            done.clear()
            done.update(results)
            est = live_estimate(cfg, problem, results) if on_progress is None else on_progress(results)
            progress.update(task, completed=len(done), info=est)

        if workers == 1:
            while True:
                todo = ready(pending - set(failed), done)
                if not todo:
                    break
                rid = todo[0]
                progress.update(task, description=f"{cfg.name}: {rid}")
                try:
                    execute_run(cfg_json, str(out), rid)
                except ModelwardError as e:
                    failed[rid] = str(e)
                except Exception as e:  # a crashing run is recorded and the study goes on
                    failed[rid] = f"{type(e).__name__}: {e}"
                pending.discard(rid)
                refresh()
        else:
            ctx = get_context("spawn")
            with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_worker_init) as pool:
                running: dict[Future[str], str] = {}
                try:
                    while True:
                        for rid in ready(pending, done):
                            if len(running) >= workers:
                                break
                            if rid in running.values():
                                continue
                            running[pool.submit(execute_run, cfg_json, str(out), rid)] = rid
                            pending.discard(rid)
                        if not running:
                            break
                        finished, _ = wait(running, return_when=FIRST_COMPLETED)
                        for fut in finished:
                            rid = running.pop(fut)
                            exc = fut.exception()
                            if exc is not None:
                                failed[rid] = f"{type(exc).__name__}: {exc}"
                        refresh()
                except KeyboardInterrupt:
                    for fut in running:
                        fut.cancel()
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise
    # runs whose original failed can never start
    blocked = {r for r in pending if r not in done and r not in failed}
    for r in blocked:
        failed[r] = "its original run failed"
    write_report(out)
    return StudyOutcome(out, len(done), total, failed)
