"""The one study frame: folder → ledger bound to the config → config file → runs (the runner) → tables.

Every study of the project (extraction, plasticity, MC-hardness, privacy audit, assessment, bias, explanations) is
a :class:`Study`: it says what its config is, which runs it plans, how one run executes and how the results become
tables. :func:`run_study` does the rest, the same way for all of them::

    out/ledger.sqlite      bound to the config's fingerprint (a different config in the folder is refused)
    out/config.json        the resolved config (or the study's own file name)
    runs                   :func:`modelward.core.runner.run_plan`: exactly once, resumable, any executor
    tables                 ``study.summarize(...)`` from the ledger's results

**What may change when a study resumes** (the one rule): only the *execution settings*, which say where and how
fast the runs execute, never what they compute — :data:`EXECUTION_SETTINGS` = ``device``, ``threads``,
``workers``, ``executor``, ``address``. Every other field is part of the fingerprint; a resume with another value
is refused with :class:`~modelward.errors.LedgerError`. A study's ``resume_ignores`` may only narrow this set
(checked when the study runs).

Example:
    >>> from modelward.core.runner import RunSpec
    >>> class Squares(Study):
    ...     name = "squares"
    ...     config_model = dict
    ...     config_file = None
    ...     def plan(self, cfg, ctx):
    ...         return [RunSpec(f"sq|{n}", {"n": n}) for n in cfg["numbers"]]
    ...     def execute(self, cfg, ctx):
    ...         return square
    ...     def summarize(self, cfg, ctx, outcome):
    ...         return sorted(r["sq"] for r in ctx.ledger.results().values())
    >>> def square(run_id, spec, deps):
    ...     return {"sq": spec["n"] ** 2}
    >>> import tempfile
    >>> run_study(Squares(), {"numbers": [1, 2, 3]}, tempfile.mkdtemp())
    [1, 4, 9]
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import torch

from modelward.core.config import dump_config
from modelward.core.ledger import RunLedger
from modelward.core.progress import ProgressSink
from modelward.core.runner import Execute, Executor, RunOutcome, RunSpec, run_plan

__all__ = ["EXECUTION_SETTINGS", "Study", "StudyContext", "config_fingerprint", "run_study", "torch_threads"]

# the one rule: a resumed study may change where and how fast its runs execute, never what they compute
EXECUTION_SETTINGS: frozenset[str] = frozenset({"device", "threads", "workers", "executor", "address"})

C = TypeVar("C")
R = TypeVar("R")


@dataclass
class StudyContext:
    """What :func:`run_study` hands a study's hooks: the folder, its ledger and where runs execute."""

    out: Path
    ledger: RunLedger
    progress: ProgressSink | None
    workers: int
    executor: str | Executor
    address: str | None

    @property
    def in_process(self) -> bool:
        """True when every run executes in this process (a progress sink can then follow each run's steps)."""
        return self.executor == "sequential" or (self.executor == "local" and self.workers <= 1)


class Study(ABC, Generic[C, R]):
    """A study for :func:`run_study`: a config model, a plan of runs, how one run executes, how results are
    summarised. Subclasses set the class attributes and implement :meth:`plan`, :meth:`execute` and
    :meth:`summarize`; the other hooks have defaults.

    Attributes:
        name: the progress key and label of the runs (one unit per run).
        config_model: the config's pydantic model.
        resume_ignores: the config fields that may change when resuming; a subset of :data:`EXECUTION_SETTINGS`
            (the default: all of them).
        config_file: the file the resolved config is written to in the folder (None: not written).
        fail_fast: re-raise the first failing run's error instead of going on with the others.
    """

    name: ClassVar[str]
    config_model: ClassVar[type]
    resume_ignores: ClassVar[frozenset[str]] = EXECUTION_SETTINGS
    config_file: ClassVar[str | None] = "config.json"
    fail_fast: ClassVar[bool] = False

    def label(self, cfg: C) -> str:
        """The progress label of the runs (default: :attr:`name`)."""
        return self.name

    def check(self, cfg: C, out: Path) -> None:
        """Refuse a bad config before the folder is created or written (default: nothing to check)."""

    def legacy_fingerprints(self, cfg: C) -> tuple[str, ...]:
        """Fingerprints older versions of the study recorded for this same config (upgraded in place)."""
        return ()

    def write_config(self, cfg: C, out: Path) -> None:
        """Write the resolved config into the folder (default: ``dump_config`` to :attr:`config_file`)."""
        if self.config_file is not None:
            dump_config(cfg, out / self.config_file)  # type: ignore[arg-type]

    @contextmanager
    def session(self, cfg: C, ctx: StudyContext) -> Iterator[None]:
        """Set-up held around the runs and the summary (thread count, work shared by the runs); default none."""
        yield

    @abstractmethod
    def plan(self, cfg: C, ctx: StudyContext) -> list[RunSpec]:
        """The runs (stable ids: re-planning the same study gives the same ids)."""

    @abstractmethod
    def execute(self, cfg: C, ctx: StudyContext) -> Execute:
        """``execute(run_id, spec, dep_results) -> dict`` for the runner (picklable for other processes)."""

    def on_result(self, cfg: C, ctx: StudyContext) -> Callable[[str, dict[str, Any]], str | None] | None:
        """A progress line after each recorded run (default: none)."""
        return None

    @abstractmethod
    def summarize(self, cfg: C, ctx: StudyContext, outcome: RunOutcome) -> R:
        """Tables and figures from the ledger's results; returns what the study's entry point returns."""


def config_fingerprint(config: Any, exclude: frozenset[str] | set[str] = frozenset()) -> str:
    """SHA-256 of the canonical JSON of `config` without the `exclude` fields (what :meth:`RunLedger.bind_config`
    records)."""
    if hasattr(config, "model_dump"):
        data = config.model_dump(mode="json", exclude=set(exclude))
    elif isinstance(config, dict):
        data = {k: v for k, v in config.items() if k not in exclude}
    else:
        data = config
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def _fields(cfg: Any) -> set[str]:
    if hasattr(type(cfg), "model_fields"):
        return set(type(cfg).model_fields)
    return set(cfg) if isinstance(cfg, dict) else set()


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """``torch.set_num_threads(n)`` for the block, restored afterwards (None: unchanged)."""
    if n is None:
        yield
        return
    prev = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


def run_study(study: Study[C, R], cfg: C, out: str | Path, *, workers: int = 1, executor: str | Executor = "local",
              address: str | None = None, progress: ProgressSink | None = None) -> R:
    """Run (or resume) `study` with `cfg` in the folder `out` and return its summary.

    Args:
        study: the study (see :class:`Study`).
        cfg: its config (an instance of ``study.config_model``).
        out: the study folder (created; one study per folder: another config there is refused).
        workers, executor, address: where the runs execute (:func:`modelward.core.runner.run_plan`).
        progress: receives one unit per run under ``study.label(cfg)`` (and whatever the study reports).

    Returns:
        ``study.summarize(...)``.

    Raises:
        LedgerError: the folder holds the study with a config that differs in more than the execution settings.
        TypeError: the study declares ``resume_ignores`` outside :data:`EXECUTION_SETTINGS`.
    """
    extra = set(study.resume_ignores) - EXECUTION_SETTINGS
    if extra:
        raise TypeError(f"{type(study).__name__}.resume_ignores: {sorted(extra)} are not execution settings "
                        f"({sorted(EXECUTION_SETTINGS)}); only those may change when a study resumes")
    out = Path(out)
    study.check(cfg, out)
    out.mkdir(parents=True, exist_ok=True)
    ledger = RunLedger(out / "ledger.sqlite")
    ledger.bind_config(cfg, exclude=set(study.resume_ignores) & _fields(cfg), legacy=study.legacy_fingerprints(cfg))
    study.write_config(cfg, out)
    ctx = StudyContext(out, ledger, progress, workers, executor, address)
    with study.session(cfg, ctx):
        outcome = run_plan(ledger, study.plan(cfg, ctx), study.execute(cfg, ctx), workers=workers,
                           executor=executor, address=address, progress=progress,
                           on_result=study.on_result(cfg, ctx), description=study.label(cfg), fail_fast=study.fail_fast)
        return study.summarize(cfg, ctx, outcome)
