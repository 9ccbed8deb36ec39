"""The run plan of a completion study: one ``orig`` run per (task, seed) and one ``re`` run per (task, seed,
part, procedure) depending on it (seed 000 §3.2: each seed repeats the whole experiment). The from-scratch
reference T0 does not depend on the part: it runs once per (task, seed) with part ``ALL_PARTS``. When the problem
decides its task list on all original runs (RL: ``select_tasks``), every retraining of a task waits for all of that
task's originals.

Run ids are stable (``orig|<task>|<seed>``, ``re|<task>|<seed>|<part>|<procedure>``) so a re-run of the same
study finds its finished runs in the ledger.
"""

from __future__ import annotations

import hashlib
import re

from modelward.completion.config import StudyConfig
from modelward.completion.metric import Thresholds
from modelward.completion.problem import CompletionProblem, OriginalRun
from modelward.completion.procedures import ALL_PARTS
from modelward.completion.supervised import SupervisedProblem
from modelward.core.registry import Registry
from modelward.core.runner import RunSpec
from modelward.errors import ConfigError


def _supervised_problem(cfg: StudyConfig) -> CompletionProblem:
    return SupervisedProblem(cfg.data, cfg.model, cfg.train, cfg.retrain.lr, cfg.retrain.lr_schedule,
                             device=cfg.device, checkpoint_every=cfg.checkpoint_every,
                             threshold_split=cfg.thresholds.split, val_fraction=cfg.thresholds.val_fraction)


def _rl_problem(cfg: StudyConfig) -> CompletionProblem:
    try:
        # lazy: the RL problem pulls in gymnasium/ALE, for kind='rl' only; without the RL area the rest still runs
        from modelward.completion.rl import RLProblem
    except ImportError as e:  # pragma: no cover - depends on the RL area being installed
        raise ConfigError(f"kind='rl': the RL completion problem is unavailable ({e})") from None
    return RLProblem.from_study(cfg)


#: study ``kind`` -> factory ``(StudyConfig) -> CompletionProblem``
PROBLEMS = Registry("completion problem kind")
PROBLEMS.register("supervised")(_supervised_problem)
PROBLEMS.register("rl")(_rl_problem)


def make_problem(cfg: StudyConfig) -> CompletionProblem:
    """The learning problem behind a study: supervised (zoo model on a data set) or RL (modelward.rl).

    A study can also be given an in-process problem directly (``run_study(cfg, out, problem=ModuleProblem(...))``).
    """
    return PROBLEMS.create(cfg.kind, cfg)


def orig_id(task: str, seed: int) -> str:
    """Run id of the original training of `task` with `seed`."""
    return f"orig|{task}|{seed}"


def retrain_id(task: str, seed: int, part: str, proc: str) -> str:
    """Run id of retraining `part` of that original with procedure `proc`."""
    return f"re|{task}|{seed}|{part}|{proc}"


def run_file_stem(run_id: str) -> str:
    """A file-system-safe, unique name for a run id."""
    readable = re.sub(r"[^A-Za-z0-9_.+-]+", "_", run_id.replace("|", "__"))[:80]
    return f"{readable}-{hashlib.sha1(run_id.encode()).hexdigest()[:8]}"


def study_parts(cfg: StudyConfig, problem: CompletionProblem) -> list[str]:
    """The parts the study resets (the configured ones, or the model's natural parts); each is validated."""
    parts = cfg.parts or problem.part_names()
    for p in parts:
        problem.validate_part(p)
    return parts


def plan(cfg: StudyConfig, problem: CompletionProblem) -> list[RunSpec]:
    """Every run of the study; each ``re`` run depends on its ``orig`` run."""
    runs: list[RunSpec] = []
    parts = study_parts(cfg, problem)
    per_task = callable(getattr(problem, "select_tasks", None))
    for task in problem.tasks:
        all_orig = tuple(orig_id(task, s) for s in cfg.seeds)
        for seed in cfg.seeds:
            oid = orig_id(task, seed)
            deps = all_orig if per_task else (oid,)
            runs.append(RunSpec(oid, {"kind": "orig", "task": task, "seed": seed}))
            for proc in cfg.all_procedures:
                if seed not in cfg.procedure_seeds(proc):
                    continue
                for part in [ALL_PARTS] if proc.kind == "T0" else parts:
                    runs.append(RunSpec(retrain_id(task, seed, part, proc.name),
                                        {"kind": "re", "task": task, "seed": seed, "part": part,
                                         "procedure": proc.name}, depends_on=deps))
    return runs


def is_usable(problem: CompletionProblem, original: OriginalRun, thr: Thresholds,
              task_originals: list[OriginalRun] | None = None) -> bool:
    """Whether a task's original run counts. With the problem's ``select_tasks`` hook (RL) the decision is the
    task's, made once on all its original runs (`task_originals`), so one game list holds for every seed; else
    the ``usable`` hook on this run, or else whether training improved on the untrained model at all."""
    select = getattr(problem, "select_tasks", None)
    if callable(select) and task_originals:
        return bool(select(task_originals)[original.task]["keep"])
    hook = getattr(problem, "usable", None)
    return bool(hook(original)) if callable(hook) else thr.learned
