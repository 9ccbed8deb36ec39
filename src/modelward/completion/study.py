"""A completion study = original training × parts × procedures × seeds (× tasks), run through the SQLite ledger.

The study is split along its seams: :mod:`~modelward.completion.config` (the study file),
:mod:`~modelward.completion.plan` (which runs, their ids and dependencies), :mod:`~modelward.completion.run`
(executing one run) and :mod:`~modelward.completion.report` (tables and plots, rebuilt from the run files). This
module ties them together on :func:`modelward.core.runner.run_plan`: interrupting (Ctrl-C, kill -9) and re-running
the same study keeps finished runs and restarts the others; ``workers`` > 1 runs runs in parallel processes.

Example (your own model, in process)::

    from modelward.completion import StudyConfig, ModuleProblem, run_study
    problem = ModuleProblem(my_net, data_split, TrainConfig(steps=300))
    outcome = run_study(StudyConfig(seeds=[0, 1], parts=["fc1"]), "out/study", problem=problem, workers=1)
    print(outcome.tables.inf_rows)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from modelward.completion.config import RetrainConfig, StudyConfig, load_study, read_study_config
from modelward.completion.plan import (
    is_usable,
    make_problem,
    orig_id,
    plan,
    retrain_id,
    run_file_stem,
    study_parts,
)
from modelward.completion.problem import CompletionProblem, OriginalRun
from modelward.completion.run import execute_run, original_from_result, record_original, write_curve
from modelward.core.config import dump_config
from modelward.core.ledger import RunLedger
from modelward.core.lock import FolderLock
from modelward.core.progress import ProgressSink
from modelward.core.runner import Executor, run_plan


@dataclass
class StudyOutcome:
    """Where the study is (`out`), how many of its runs are done, which failed (id -> error), and its tables."""

    out: Path
    done: int
    total: int
    failed: dict[str, str]
    tables: Any = None  # modelward.completion.report.HardnessTables


def interrupted_runs(out: str | Path) -> int:
    """How many runs a previous, interrupted invocation left unfinished in `out` (0 for a new folder)."""
    path = Path(out) / "ledger.sqlite"
    if not path.is_file():
        return 0
    return RunLedger(path).counts()["running"]


def run_study(cfg: StudyConfig, out: str | Path, workers: int | None = None, progress: ProgressSink | None = None,
              *, problem: CompletionProblem | None = None, preset_originals: list[OriginalRun] | None = None,
              executor: str | Executor = "local", address: str | None = None) -> StudyOutcome:
    """Run (or resume) the study in `out` and write its report (hardness tables and plots).

    Args:
        cfg: the study.
        out: the study folder (``study.json``, ``ledger.sqlite``, ``curves/``, ``runs/``, ``checkpoints/``,
            ``hardness.*``).
        workers: parallel processes (default: 1 when `problem` is given, else the number of cores).
        progress: receives one unit per run, with a running MC-hardness estimate as its status line.
        problem: the learning problem, e.g. a :class:`~modelward.completion.supervised.ModuleProblem` around your
            own ``nn.Module``; default: built from ``cfg`` (zoo model on ``cfg.data``, or RL). With workers > 1 it
            must be picklable.
        preset_originals: already-trained original runs (e.g. a model trained split between parties); their
            seeds' retraining runs start from them.
        executor: see :func:`modelward.core.runner.run_plan` (``"ray"`` runs every run as a Ray task).
        address: the Ray cluster to join with ``executor="ray"`` (``"auto"``/``"HOST:PORT"``; None = local).

    Returns:
        :class:`StudyOutcome` (failed runs restart when the study is run again).

    Example:
        >>> import torch
        >>> from modelward.completion import ModuleProblem, StudyConfig
        >>> from modelward.core.data import DataConfig, load_data
        >>> from modelward.core.train import TrainConfig
        >>> net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
        >>> problem = ModuleProblem(net, load_data(DataConfig(source="digits")), TrainConfig(steps=50))
        >>> outcome = run_study(StudyConfig(seeds=[0], parts=["1"]), "runs/mine", problem=problem)  # doctest: +SKIP
        >>> outcome.tables.inf_rows  # MC-hardness per part and procedure  # doctest: +SKIP
    """
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    with FolderLock(out, "study"):  # one driver per study folder: recovering interrupted runs is then safe
        return _run_study(cfg, out, workers, progress, problem, preset_originals, executor, address)


def _run_study(cfg: StudyConfig, out: Path, workers: int | None, progress: ProgressSink | None,
               problem: CompletionProblem | None, preset_originals: list[OriginalRun] | None,
               executor: str | Executor, address: str | None = None) -> StudyOutcome:
    import os

    from modelward.completion.report import live_estimate, write_report

    given = problem
    problem = problem or make_problem(cfg)
    runs = plan(cfg, problem)
    if cfg.device.startswith("cuda"):  # a cluster executor then places each run on a GPU of its own
        runs = [replace(r, gpus=1.0) for r in runs]
    ledger = RunLedger(out / "ledger.sqlite")
    # a study may resume on another device; `legacy`: the fingerprint folders made before the shared runner have
    # (a config without the fields added since, device and checkpoint_every)
    legacy_json = cfg.model_dump_json(exclude={"device", "checkpoint_every"} if cfg.checkpoint_every is None
                                      else {"device"})
    ledger.bind_config(cfg, exclude={"device"}, legacy=(hashlib.sha256(legacy_json.encode()).hexdigest(),))
    dump_config(cfg, out / "study.json")
    for r in runs:
        ledger.add(r.run_id, r.spec)
    ledger.recover()  # a preset original interrupted while being recorded is recorded again
    for run in preset_originals or []:
        rid = orig_id(run.task, run.seed)
        if ledger.status(rid) != "done" and ledger.start(rid, "preset"):
            record_original(out, ledger, run)
    results = ledger.results()

    def on_result(run_id: str, result: dict[str, Any]) -> str:
        results[run_id] = result
        return live_estimate(cfg, problem, results)

    workers = workers or (1 if given is not None else os.cpu_count() or 1)
    execute = partial(execute_run, cfg.model_dump_json(), str(out), given)
    outcome = run_plan(ledger, runs, execute, workers=max(1, workers), executor=executor, progress=progress,
                       on_result=on_result, description=f"study {cfg.name}", address=address)
    tables = write_report(out, problem)
    return StudyOutcome(out, outcome.done, outcome.total, outcome.failed, tables)


# the names this module had before the split (kept for existing imports)
__all__ = ["RetrainConfig", "StudyConfig", "StudyOutcome", "execute_run", "interrupted_runs", "is_usable",
           "load_study", "make_problem", "orig_id", "original_from_result", "plan", "read_study_config",
           "record_original", "retrain_id", "run_file_stem", "run_study", "study_parts", "write_curve"]
