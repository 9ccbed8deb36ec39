"""What a section returns, and the small helpers every section shares."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from modelward.assess.findings import SEVERITY_ORDER, Metric, rate_metric, straddles
from modelward.core.progress import NullProgress, ProgressSink
from modelward.core.records import write_table
from modelward.errors import ModelwardError

Verdict = Literal["green", "amber", "red", "info", "none"]
#: a finding's severity as a section verdict (the card's colour)
SEVERITY_VERDICT: dict[str, Verdict] = {"critical": "red", "high": "red", "medium": "amber", "low": "green",
                                        "info": "info"}


class NotAssessed(ModelwardError):
    """Raised by a section whose inputs are missing; the report shows "not assessed, because <message>"."""


@dataclass
class Headline:
    """The one number that drives a section's verdict."""

    label: str
    value: float
    text: str


@dataclass
class SectionResult:
    """One section of the report (JSON-able: it is what the ledger records and report.json carries)."""

    section: str
    title: str
    status: Literal["assessed", "not_assessed", "failed"] = "assessed"
    verdict: Verdict = "info"
    headline: Headline | None = None
    rule: str = ""  # how the verdict follows from the headline, in words
    summary: str = ""
    reason: str = ""  # why not assessed / what failed
    tables: list[dict[str, Any]] = field(default_factory=list)
    figures: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    # measured numbers findings are made of (see modelward.assess.findings.Metric); later attacks add theirs here
    metrics: list[dict[str, Any]] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)  # filled by modelward.assess.findings
    warnings: list[str] = field(default_factory=list)  # shown above the section (e.g. a model-quality warning)
    plan: dict[str, Any] = field(default_factory=dict)  # the work announced before it ran and its estimate

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def add_table(self, out: Path, name: str, title: str, rows: list[dict[str, Any]], columns: list[str] | None = None,
                  notes: list[str] | None = None) -> None:
        """Write `rows` as <name>.csv/.md/.json in the section folder and list them in the report."""
        cols = columns or (list(rows[0]) if rows else [])
        write_table(out, name, rows, cols, title=title, notes=notes)
        self.tables.append({"name": name, "title": title, "columns": cols, "rows": rows, "notes": notes or []})

    def add_metric(self, key: str, label: str, value: float, *, k: int | None = None, n: int | None = None,
                   risk_up: bool, unit: str = "fraction", headline: bool = False,
                   seeds: list[float] | None = None, context: dict[str, Any] | None = None) -> None:
        """Record a measured number (see :class:`modelward.assess.findings.Metric`): `k` successes of `n` trials
        give a Clopper–Pearson interval, `seeds` (one value per seed) a t interval; `risk_up` says whether a
        larger value means more risk (a TPR) or less (a robust accuracy)."""
        self.metrics.append(Metric(key, label, float(value), k=k, n=n, risk_up=risk_up, unit=unit,
                                   headline=headline, seeds=seeds, context=context or {}).to_dict())

    def add_figure(self, path: Path, root: Path, title: str, caption: str = "") -> None:
        self.figures.append({"path": str(path.relative_to(root)), "title": title, "caption": caption})


def traffic_light(value: float, green: float, amber: float, higher_is_better: bool = True) -> Verdict:
    """green/amber/red from a value and two thresholds (inclusive on the good side)."""
    if higher_is_better:
        return "green" if value >= green else "amber" if value >= amber else "red"
    return "green" if value <= green else "amber" if value <= amber else "red"


STRADDLES = "the 95 % interval straddles the threshold"


def interval_verdict(metrics: list[dict[str, Any]]) -> tuple[Verdict, dict[str, Any] | None, str]:
    """The card's colour from rated metrics' intervals (issue 38): each is rated by
    :func:`modelward.assess.findings.rate_metric` (red only when its whole interval is beyond the amber threshold,
    green only when its whole interval is on the good side of the green one, amber otherwise); the worst rating
    decides, among equals the worst point estimate.

    Returns:
        ``(verdict, the deciding metric, a note)``: the note says when the deciding interval straddles a threshold
        (amber because the sample cannot decide) and is ``""`` otherwise.
    """
    rated = [(rate_metric(m), m) for m in metrics if m.get("context", {}).get("thresholds")]
    if not rated:
        return "info", None, ""
    sev, m = min(rated, key=lambda r: (SEVERITY_ORDER.index(r[0]),
                                       -r[1]["value"] if r[1]["risk_up"] else r[1]["value"]))
    note = ""
    if m.get("ci") and straddles(m):
        lo, hi = m["ci"]
        note = f"{STRADDLES} ({m['label']}: 95 % CI {lo:.3g} to {hi:.3g})"
    elif not m.get("ci"):
        note = f"{m['label']} has no interval (not estimated from samples): the point estimate is rated"
    return SEVERITY_VERDICT[sev], m, note


def pct(v: float) -> str:
    return f"{100 * v:.1f} %"


TITLES = {
    "robustness": "Robustness to evasion attacks",
    "privacy": "Privacy: membership inference and model inversion",
    "extraction": "Model extraction (KnockoffNets) and its defenses",
    "completion": "Model completion (MC-hardness of a split)",
    "explanations": "Explanations and bias amplification",
    "backdoor": "Backdoors and poisoning (model, training data)",
}


def load_sections(out: Path) -> list[dict[str, Any]]:
    """The section results recorded in `out`, in the config's order (from the files, not from memory)."""
    cfg = json.loads((out / "assess.json").read_text())
    found = []
    for name in cfg["sections"]:
        f = out / name / "section.json"
        if f.is_file():
            found.append(json.loads(f.read_text()))
        else:
            found.append(SectionResult(name, TITLES[name], status="not_assessed", verdict="none",
                                       reason="it has not run yet (the assessment was interrupted)").to_dict())
    return found


# ---------------------------------------------------------------------------------------------- planned work
@dataclass(frozen=True)
class Work:
    """One piece of a section's planned work, counted in point-gradients (one forward and backward pass of one
    input): ``points × per_point × runs``.

    Attributes:
        what: e.g. "PGD L∞"; points: inputs; per_point: gradient evaluations per input and run (steps ×
        restarts); runs: repetitions (ε values, targets, models); detail: how the count is made, in words.
    """

    what: str
    points: int
    per_point: int
    runs: int = 1
    detail: str = ""

    @property
    def units(self) -> int:
        return self.points * self.per_point * self.runs

    def text(self) -> str:
        return f"{self.what}: {self.detail or f'{self.runs} × {self.points} points × {self.per_point}'}"


def seconds_per_point_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor, n: int = 64) -> float:
    """Measured seconds of one forward + backward pass per input on this machine (the unit of every estimate):
    a warm-up pass on 8 inputs, then one timed pass on a batch of `n` (the attacks' batches are large: per-input
    time falls with the batch, so a small timed batch would overstate it several-fold on a loaded machine)."""
    dev = next((p.device for p in model.parameters()), torch.device("cpu"))
    was = model.training
    model.eval()
    try:
        for xb, yb in ((x[:8], y[:8]), (x[:n], y[:n])):
            t0 = time.perf_counter()
            with torch.enable_grad():
                F.cross_entropy(model(xb.to(dev)), yb.to(dev)).backward()
            took = time.perf_counter() - t0
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was)
    return took / max(1, min(n, len(x)))


def _clock(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


class SectionProgress:
    """A section's progress: it announces its planned work and an estimate before it starts (:meth:`announce`),
    then reports what it has done (:meth:`step`: the attack, ε and points), to the command's bars and to the
    assessment's ``progress.log`` (through :mod:`modelward.core.progress`)."""

    def __init__(self, section: str, sink: ProgressSink | None = None) -> None:
        self.section = section
        self.sink = sink or NullProgress()
        self.plan: dict[str, Any] = {}

    def announce(self, works: list[Work], seconds_per_unit: float, note: str = "") -> dict[str, Any]:
        """Start the section's progress with `works` and the estimate they make at the measured speed.

        Returns:
            The plan as recorded in the report: each piece, the total point-gradients, the measured seconds per
            point-gradient and the estimated seconds.
        """
        total = sum(w.units for w in works)
        estimate = total * seconds_per_unit
        self.plan = {"work": [{"what": w.what, "detail": w.text(), "units": w.units} for w in works],
                     "units": total, "seconds_per_unit": seconds_per_unit, "estimate_seconds": estimate,
                     "note": note}
        text = (f"planned: {'; '.join(w.text() for w in works)} = {total:,} point-gradients, about "
                f"{_clock(estimate)} at {1000 * seconds_per_unit:.2f} ms each (measured here)" + (f"; {note}" if note
                                                                                                   else ""))
        self.plan["text"] = text
        self.sink.start(self.section, total, f"{self.section} (~{_clock(estimate)})")
        self.sink.advance(self.section, 0, text)  # a message: logged in full, shown until the first step
        return self.plan

    def step(self, units: int, info: str) -> None:
        """`units` more point-gradients done; `info` names the attack, ε and points."""
        self.sink.advance(self.section, units, info)

    def done(self, info: str = "") -> None:
        self.sink.done(self.section, info)


_CURRENT: list[SectionProgress] = []


@contextmanager
def section_progress_for(section: str, sink: ProgressSink | None) -> Iterator[SectionProgress]:
    """Make a :class:`SectionProgress` for `section` the current one for the block (what
    :func:`section_progress` returns inside a section's ``run``)."""
    sp = SectionProgress(section, sink)
    _CURRENT.append(sp)
    try:
        yield sp
    finally:
        _CURRENT.remove(sp)


def section_progress(section: str = "section") -> SectionProgress:
    """The running section's progress (a silent one outside :func:`section_progress_for`)."""
    return _CURRENT[-1] if _CURRENT else SectionProgress(section)


# ---------------------------------------------------------------------------------------------- the quick budget
def forward_flops(model: nn.Module, x: torch.Tensor) -> float:
    """FLOPs of one input's forward pass, counted by torch's ``FlopCounterMode`` (matrix products and
    convolutions); at least 2 per parameter when the count fails (an op it does not know)."""
    from torch.utils.flop_counter import FlopCounterMode

    dev = next((p.device for p in model.parameters()), torch.device("cpu"))
    params = sum(p.numel() for p in model.parameters())
    was = model.training
    model.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(x[:1].to(dev))
        counted = float(counter.get_total_flops())
    except Exception:  # noqa: BLE001 - a count is an estimate: fall back to the parameter count
        counted = 0.0
    finally:
        model.train(was)
    return max(counted, 2.0 * params)


def fit_budget(section: str, sizes: Any, explicit: dict[str, int], plan: Any, flops_per_unit: float,
               floors: dict[str, int]) -> tuple[Any, list[Work], str]:
    """The largest scaling of the section's counts (down to `floors`, never below, never the `explicit` ones) whose
    planned work fits ``sizes.budget_tflop``; unchanged when there is no budget or it fits.

    Args:
        section: the section's name (for the note).
        sizes: the profile's :class:`~modelward.assess.profiles.ProfileSizes`.
        explicit: the counts the config set in ``[sizes]`` (kept as given).
        plan: ``plan(sizes) -> list[Work]`` for some sizes.
        flops_per_unit: forward+backward FLOPs of one point-gradient (3 × :func:`forward_flops`).
        floors: the counts the budget may reduce, and their least values.

    Returns:
        ``(sizes, works, note)``: the sizes to run, their planned work, and the reduction in words ("" if none).
    """
    from dataclasses import replace

    works = plan(sizes)
    budget = getattr(sizes, "budget_tflop", None)
    if budget is None or sum(w.units for w in works) * flops_per_unit <= budget * 1e12:
        return sizes, works, ""
    free = {k: f for k, f in floors.items() if k not in explicit and getattr(sizes, k) is not None}

    def scaled(s: float) -> Any:
        return replace(sizes, **{k: max(min(f, getattr(sizes, k)), round(getattr(sizes, k) * s))
                                 for k, f in free.items()})

    lo, hi = 0.0, 1.0
    for _ in range(20):  # the planned work grows with every count: bisect the common factor
        mid = (lo + hi) / 2
        if sum(w.units for w in plan(scaled(mid))) * flops_per_unit <= budget * 1e12:
            lo = mid
        else:
            hi = mid
    new = scaled(lo)
    works = plan(new)
    total = sum(w.units for w in works) * flops_per_unit / 1e12
    changed = ", ".join(f"{k} {getattr(sizes, k)} → {getattr(new, k)}" for k in free
                        if getattr(new, k) != getattr(sizes, k))
    note = (f"quick profile: {changed} to fit its budget of {budget:g} TFLOP per section (this model: "
            f"{flops_per_unit / 1e9:.3g} GFLOP per point-gradient; planned {total:.2g} TFLOP"
            + (", the floors reached" if total > budget else "") + "); --profile standard evaluates all")
    return new, works, note
