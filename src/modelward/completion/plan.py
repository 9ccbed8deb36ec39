"""The run plan of a completion study: one ``orig`` run per (task, seed) and one ``re`` run per (task, seed,
part, procedure) depending on it (seed 000 §3.2: each seed repeats the whole experiment).

Run ids are stable (``orig|<task>|<seed>``, ``re|<task>|<seed>|<part>|<procedure>``) so a re-run of the same
study finds its finished runs in the ledger.
"""

from __future__ import annotations

import hashlib
import re

from modelward.completion.config import StudyConfig
from modelward.completion.metric import Thresholds
from modelward.completion.problem import CompletionProblem, OriginalRun
from modelward.core.registry import Registry
from modelward.core.runner import RunSpec
from modelward.errors import ConfigError


def _supervised_problem(cfg: StudyConfig) -> CompletionProblem:
    from modelward.completion.supervised import SupervisedProblem

    return SupervisedProblem(cfg.data, cfg.model, cfg.train, cfg.retrain.lr, cfg.retrain.lr_schedule,
                             device=cfg.device, checkpoint_every=cfg.checkpoint_every)


def _rl_problem(cfg: StudyConfig) -> CompletionProblem:
    try:
        from modelward.rl.completion import RLProblem
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
    for task in problem.tasks:
        for seed in cfg.seeds:
            oid = orig_id(task, seed)
            runs.append(RunSpec(oid, {"kind": "orig", "task": task, "seed": seed}))
            for part in parts:
                for proc in cfg.procedures:
                    runs.append(RunSpec(retrain_id(task, seed, part, proc.name),
                                        {"kind": "re", "task": task, "seed": seed, "part": part,
                                         "procedure": proc.name}, depends_on=(oid,)))
    return runs


def is_usable(problem: CompletionProblem, original: OriginalRun, thr: Thresholds) -> bool:
    """Whether a task's original run counts: the problem's ``usable`` hook (RL: better than a random policy), or
    else whether training improved on the untrained model at all."""
    hook = getattr(problem, "usable", None)
    return bool(hook(original)) if callable(hook) else thr.learned
