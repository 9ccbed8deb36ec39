"""What a section returns, and the small helpers every section shares."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from modelward.assess.findings import Metric
from modelward.core.records import write_table
from modelward.errors import ModelwardError

Verdict = Literal["green", "amber", "red", "info", "none"]


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
