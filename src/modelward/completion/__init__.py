"""Model-completion hardness (seed 000 §3): thresholds, retraining procedures T0 (reference) and T1–T4, resumable
studies.

The main verbs, imported lazily (``from modelward.completion import run_study, ModuleProblem``):
``run_study(config, out, problem=...)`` runs (or resumes) a study — on a zoo model and data set from the config,
or on your own ``nn.Module`` through ``ModuleProblem``; ``write_report(out)`` rebuilds its tables; ``StudyConfig`` /
``load_study`` read a config; ``ProcedureSpec`` is a retraining procedure; ``Thresholds``, ``first_reach`` and
``hardness_ratio`` are the MC-hardness metric.
"""

from modelward.core.registry import lazy_exports

_EXPORTS = {
    "Thresholds": "modelward.completion.metric:Thresholds",
    "first_reach": "modelward.completion.metric:first_reach",
    "hardness_ratio": "modelward.completion.metric:hardness_ratio",
    "run_study": "modelward.completion.study:run_study",
    "StudyOutcome": "modelward.completion.study:StudyOutcome",
    "StudyConfig": "modelward.completion.config:StudyConfig",
    "load_study": "modelward.completion.config:load_study",
    "ProcedureSpec": "modelward.completion.problem:ProcedureSpec",
    "CompletionProblem": "modelward.completion.problem:CompletionProblem",
    "ModuleProblem": "modelward.completion.supervised:ModuleProblem",
    "SupervisedProblem": "modelward.completion.supervised:SupervisedProblem",
    "PROBLEMS": "modelward.completion.plan:PROBLEMS",
    "write_report": "modelward.completion.report:write_report",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
