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
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
from modelward.completion.report import live_estimate, write_report
from modelward.completion.run import execute_run, original_from_result, record_original, write_curve
from modelward.core.ledger import RunLedger
from modelward.core.lock import FolderLock
from modelward.core.progress import ProgressSink
from modelward.core.runner import Execute, Executor, RunOutcome, RunSpec
from modelward.core.study import Study, StudyContext
from modelward.core.study import run_study as run_core_study


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


def run_study(cfg: StudyConfig, out: str | Path, progress: ProgressSink | None = None, *, workers: int | None = None,
              problem: CompletionProblem | None = None, preset_originals: list[OriginalRun] | None = None,
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
    workers = workers or (1 if problem is not None else os.cpu_count() or 1)
    with FolderLock(out, "study"):  # one driver per study folder: recovering interrupted runs is then safe
        return run_core_study(CompletionStudy(problem, preset_originals), cfg, out, workers=max(1, workers),
                              executor=executor, address=address, progress=progress)


class CompletionStudy(Study[StudyConfig, StudyOutcome]):
    """The MC-hardness study in the core frame: original trainings, then retrainings per part × procedure × seed.

    Args:
        problem: the learning problem given by the caller (None: built from the config).
        preset_originals: original runs trained elsewhere, recorded before the runs start.
    """

    name = "study"
    config_model = StudyConfig
    config_file = "study.json"

    def __init__(self, problem: CompletionProblem | None = None,
                 preset_originals: list[OriginalRun] | None = None) -> None:
        self.given = problem
        self.preset_originals = preset_originals or []
        self.problem: CompletionProblem | None = problem
        self.runs: list[RunSpec] = []
        self.results: dict[str, dict[str, Any]] = {}

    def label(self, cfg: StudyConfig) -> str:
        return f"study {cfg.name}"

    def check(self, cfg: StudyConfig, out: Path) -> None:
        self.problem = self.given or make_problem(cfg)  # a bad data source / model fails before the ledger
        self.runs = plan(cfg, self.problem)
        if cfg.device.startswith("cuda"):  # a cluster executor then places each run on a GPU of its own
            self.runs = [replace(r, gpus=1.0) for r in self.runs]

    def legacy_fingerprints(self, cfg: StudyConfig) -> tuple[str, ...]:
        # folders made before the shared runner have a config without the fields added since (device and
        # checkpoint_every)
        legacy_json = cfg.model_dump_json(exclude={"device", "checkpoint_every"} if cfg.checkpoint_every is None
                                          else {"device"})
        return (hashlib.sha256(legacy_json.encode()).hexdigest(),)

    @contextmanager
    def session(self, cfg: StudyConfig, ctx: StudyContext) -> Iterator[None]:
        ledger = ctx.ledger
        for r in self.runs:
            ledger.add(r.run_id, r.spec)
        ledger.recover()  # a preset original interrupted while being recorded is recorded again
        for run in self.preset_originals:
            rid = orig_id(run.task, run.seed)
            if ledger.status(rid) != "done" and ledger.start(rid, "preset"):
                record_original(ctx.out, ledger, run)
        self.results = ledger.results()
        yield

    def plan(self, cfg: StudyConfig, ctx: StudyContext) -> list[RunSpec]:
        return self.runs

    def execute(self, cfg: StudyConfig, ctx: StudyContext) -> Execute:
        return partial(execute_run, cfg.model_dump_json(), str(ctx.out), self.given)

    def on_result(self, cfg: StudyConfig, ctx: StudyContext) -> Callable[[str, dict[str, Any]], str]:
        problem = self.problem
        assert problem is not None

        def on_result(run_id: str, result: dict[str, Any]) -> str:
            self.results[run_id] = result
            return live_estimate(cfg, problem, self.results)

        return on_result

    def summarize(self, cfg: StudyConfig, ctx: StudyContext, outcome: RunOutcome) -> StudyOutcome:
        assert self.problem is not None
        tables = write_report(ctx.out, self.problem)
        return StudyOutcome(ctx.out, outcome.done, outcome.total, outcome.failed, tables)


# the names this module had before the split (kept for existing imports)
__all__ = ["RetrainConfig", "StudyConfig", "StudyOutcome", "execute_run", "interrupted_runs", "is_usable",
           "load_study", "make_problem", "orig_id", "original_from_result", "plan", "read_study_config",
           "record_original", "retrain_id", "run_file_stem", "run_study", "study_parts", "write_curve"]
