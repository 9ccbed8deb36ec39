"""`modelward assess`: every section as one run of the shared runner, then report.json and report.html.

Each section is a run in the folder's ledger (``ledger.sqlite``): an interrupted assessment resumes with the
sections that are not done, a finished one is never recomputed, and ``--executor`` / ``--workers`` spread sections
over processes or a Ray cluster. A section that cannot be assessed (no split configured, an optional dependency
missing, an architecture an attack cannot handle) is recorded as *not assessed, because …*; a section that crashes
is recorded as *failed* with its error — the report shows both, it never drops a section.
"""

from __future__ import annotations

import importlib
import os
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from modelward.assess.config import AssessConfig
from modelward.assess.findings import attach_findings
from modelward.assess.preflight import preflight, reopen_sections
from modelward.assess.profiles import profile_sizes
from modelward.assess.report import write_report
from modelward.assess.sections.common import (
    TITLES,
    NotAssessed,
    SectionResult,
    load_sections,
    section_progress_for,
)
from modelward.assess.target import load_target
from modelward.core.device import resolve_device
from modelward.core.entrypoints import TRUST_ENV, code_trusted, trust_code
from modelward.core.progress import LoggingProgress, ProgressSink, TeeProgress
from modelward.core.records import atomic_write_json
from modelward.core.runner import Execute, RunOutcome, RunSpec
from modelward.core.seed import seeded
from modelward.core.study import Study, StudyContext, run_study

__all__ = ["TITLES", "AssessStudy", "execute_section", "load_sections", "plan_sections", "run_assessment"]

def execute_section(run_id: str, spec: dict[str, Any], deps: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One section, end to end (module level: executors may run it in another process)."""
    import torch

    cfg = AssessConfig.model_validate_json(spec["config"])
    name = spec["section"]
    root = Path(spec["out"])
    out = root / name
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    # each section announces its planned work and reports progress: to the command's bars when it runs in the
    # command's process, and always to <out>/progress.log (and the "modelward.progress" logger)
    sink = TeeProgress(LoggingProgress(root / "progress.log"), *_LOCAL_SINKS[-1:])
    try:
        module = importlib.import_module(f"modelward.assess.sections.{name}")
        target = load_target(cfg)
        device = resolve_device(cfg.device)
        target.model.to(device)
        with seeded(cfg.seed), torch.inference_mode(False), section_progress_for(name, sink) as sp:
            try:
                result: SectionResult = module.run(cfg, target, profile_sizes(cfg), out, root)
            finally:
                plan = sp.plan
                sp.done()
        result.plan = plan
    except NotAssessed as e:
        result = SectionResult(name, TITLES[name], status="not_assessed", verdict="none", reason=str(e))
    except ImportError as e:  # an optional dependency of this section is missing
        result = SectionResult(name, TITLES[name], status="not_assessed", verdict="none",
                               reason=f"a dependency is not installed ({e}); install modelward's extras")
    except Exception as e:  # noqa: BLE001 - recorded in the report (and the traceback next to it), not hidden
        (out / "error.txt").write_text("".join(traceback.format_exception(e)))
        result = SectionResult(name, TITLES[name], status="failed", verdict="none",
                               reason=f"{type(e).__name__}: {e} (traceback in {name}/error.txt)")
    result.seconds = time.perf_counter() - t0

    data = attach_findings(result.to_dict(), root)
    atomic_write_json(out / "section.json", data)
    if data["status"] == "failed":  # the ledger records it as failed: the next run retries it (#31.7)
        raise SectionFailed(f"{name}: {data['reason']}")
    return data


#: the command's progress sink while an assessment runs in this process (sections run here report to it)
_LOCAL_SINKS: list[ProgressSink] = []


class SectionFailed(RuntimeError):
    """A section crashed; its section.json says why, and the ledger keeps it pending for the next run."""


def plan_sections(cfg: AssessConfig, out: Path) -> list[RunSpec]:
    blob = cfg.model_dump_json()
    return [RunSpec(f"section|{s}", {"section": s, "config": blob, "out": str(out)}) for s in cfg.sections]


class AssessStudy(Study[AssessConfig, RunOutcome]):
    """The assessment in the core frame: one run per section, then report.json and report.html.

    Args:
        retry: also re-run sections recorded as *not assessed* (failed ones are always re-run).
    """

    name = "assess"
    config_model = AssessConfig
    config_file = "assess.json"

    def __init__(self, retry: bool = False) -> None:
        self.retry = retry

    def check(self, cfg: AssessConfig, out: Path) -> None:
        resolve_device(cfg.device)  # a device this machine lacks is refused before any work
        profile_sizes(cfg)  # as an unknown [sizes] field

    def write_config(self, cfg: AssessConfig, out: Path) -> None:
        atomic_write_json(out / self.config_file, cfg.model_dump(mode="json"))  # read back by the report
        preflight(cfg, out)  # model-file scan, the model and data loaded once, the quality check, target.json

    @contextmanager
    def session(self, cfg: AssessConfig, ctx: StudyContext) -> Iterator[None]:
        # the user trusted this config's entry point; its sections load the model again, possibly in worker
        # processes that see the config as JSON, where the operator's trust mark is never written: they inherit the
        # switch, for this run only
        # (a model entry point, or a data entry point: issue 39)
        lend = (cfg.model is not None and cfg.model.code_trusted or cfg.data is not None and cfg.data.code_trusted) \
            and not code_trusted()
        if lend:
            trust_code()
        if ctx.progress is not None:
            _LOCAL_SINKS.append(ctx.progress)
        try:
            reopen_sections(ctx.ledger, ctx.out, cfg.sections, retry=self.retry)
            yield
        finally:
            if ctx.progress is not None:
                _LOCAL_SINKS.remove(ctx.progress)
            if lend:
                os.environ.pop(TRUST_ENV, None)

    def plan(self, cfg: AssessConfig, ctx: StudyContext) -> list[RunSpec]:
        return plan_sections(cfg, ctx.out)

    def execute(self, cfg: AssessConfig, ctx: StudyContext) -> Execute:
        return execute_section

    def on_result(self, cfg: AssessConfig, ctx: StudyContext) -> Callable[[str, dict[str, Any]], str]:
        return lambda rid, r: f"{r['section']}: {r['status']}"

    def summarize(self, cfg: AssessConfig, ctx: StudyContext, outcome: RunOutcome) -> RunOutcome:
        write_report(ctx.out)
        return outcome


def run_assessment(cfg: AssessConfig, out: str | Path, progress: ProgressSink | None = None, *, workers: int = 1,
                   executor: str = "local", address: str | None = None, retry: bool = False) -> RunOutcome:
    """Run (or resume) every section of `cfg` in folder `out`, then write report.json and report.html.

    Args:
        cfg: the assessment (model, data, profile, sections, optional split).
        out: the output folder (one assessment per folder: another config there is refused).
        workers, executor, address: where sections run (see :func:`modelward.core.runner.run_plan`).
        progress: receives one unit per section.
        retry: also re-run sections recorded as *not assessed* (failed ones are always re-run).

    Returns:
        The runner's :class:`~modelward.core.runner.RunOutcome` (failed sections are also in the report).

    Example:
        >>> from modelward.assess import AssessConfig, run_assessment
        >>> run_assessment(AssessConfig(checkpoint="model.safetensors"), "assess-out")  # doctest: +SKIP
    """
    return run_study(AssessStudy(retry), cfg, Path(out).resolve(), workers=workers, executor=executor,
                     address=address, progress=progress)
