"""Compare two assessments of a model (``modelward assess diff OLD NEW --fail-on robustness:-5,privacy:+2``).

Metrics are matched by section and key. What counts as a *change* is decided by intervals, not by the point
estimates, and each interval carries every source of noise of the metric it belongs to:

- a proportion counted as k of n (an accuracy, a robust accuracy) has Wilson's interval, and the difference of two
  of them Newcombe's hybrid score interval (Newcombe 1998, method 10);
- a metric whose section computed its own interval (``context.ci_method``: a TPR at a low FPR, whose threshold is
  itself estimated from the non-members; a DeLong AUC; an advantage) is differenced with the MOVER method from the
  two intervals (Zou & Donner 2008; Newcombe's interval is its special case), so the noise of *both* runs, and of
  every sample each rests on, enters the interval of the change;
- a proportion both reports measured on the *same* points with their per-point outcomes recorded
  (``context.outcomes`` and an equal ``context.points`` id, a SHA-256 of the evaluated inputs and labels: see
  :mod:`modelward.assess.outcomes`) is differenced with Newcombe's paired interval (Newcombe 1998, paired method
  10), which the correlation of the two runs makes much narrower; different points, a changed id or outcomes that
  do not add up to the metric's own count fall back to the unpaired interval, and ``Change.interval`` says which
  was used and why;
- other numbers (ratios, MC-hardness over seeds) change significantly when their own intervals do not overlap;
  numbers without an interval never count as significant changes.

A change is significant when its 95 % interval excludes 0. A gate ``SECTION:±X`` fails when the whole 95 %
interval of the change of a metric of that section with a verdict rule is beyond X in the stated direction:
``robustness:-5`` fails when the interval's upper end is below −5 points, ``privacy:+2`` when its lower end is above
+2 points (fractions and AUCs are in points, other units raw). A metric without an interval of its change (no
counts, no intervals of its own) never fires a gate. So a gate fires only on a change larger than the noise of two honest runs: re-running the same
assessment, or retraining the same recipe with another seed, raises no alarm (bench/privacy_gate.py measures it).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from modelward.assess.outcomes import paired_cells
from modelward.core.stats import Z95, mover, newcombe, newcombe_paired, wilson
from modelward.errors import ConfigError, DataError

__all__ = ["Z95", "Change", "compare", "diff_reports", "load_report", "mover", "newcombe", "newcombe_paired",
           "parse_fail_on", "wilson"]

#: units whose changes are shown and gated in points (×100)
POINT_UNITS = ("fraction", "auc")


@dataclass
class Change:
    """One metric compared between OLD and NEW."""

    section: str
    key: str
    label: str
    unit: str
    old: float | None
    new: float | None
    delta: float | None  # in points for fractions
    delta_ci: list[float] | None  # interval of the difference (points for fractions), where computed
    significant: bool
    riskier: bool | None  # the change goes toward more risk
    gated: str = ""  # the threshold it broke, if any
    interval: str = ""  # how the interval of the change was computed (paired, unpaired, ...) and why


def _metrics(report: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for s in report.get("sections", []):
        for m in s.get("metrics", []):
            out[(s["section"], m["key"])] = m
    return out


def parse_fail_on(spec: str | None) -> dict[str, float]:
    """``"robustness:-5,privacy:+2"`` → ``{"robustness": -5.0, "privacy": 2.0}`` (the sign is the direction).

    Raises:
        ConfigError: a malformed entry (the valid form is named).
    """
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in (spec or "").split(","))):
        name, _, num = part.partition(":")
        try:
            val = float(num)
        except ValueError:
            val = float("nan")
        if not name or not num or num[0] not in "+-" or val != val or val == 0:
            raise ConfigError(f"--fail-on {part!r}: expected SECTION:+X or SECTION:-X (e.g. robustness:-5,"
                              "privacy:+2; X in points for accuracies and rates)")
        out[name.strip()] = val
    return out


def compare(old: dict[str, Any], new: dict[str, Any], fail_on: dict[str, float] | None = None) -> list[Change]:
    """Every metric present in both reports, with whether it moved significantly and which gate it broke.

    Args:
        old, new: two ``report.json`` documents.
        fail_on: gates from :func:`parse_fail_on`.

    Returns:
        The changes, significant ones first.
    """
    fail_on = fail_on or {}
    a, b = _metrics(old), _metrics(new)
    unknown = set(fail_on) - {s for s, _ in a} - {s for s, _ in b}
    if unknown:
        raise ConfigError(f"--fail-on: no metrics for section(s) {sorted(unknown)} in either report; sections: "
                          f"{sorted({s for s, _ in a} | {s for s, _ in b})}")
    out = []
    for key in sorted(set(a) & set(b)):
        m1, m2 = a[key], b[key]
        scale = 100.0 if m2.get("unit", "fraction") in POINT_UNITS else 1.0
        v1, v2 = m1["value"], m2["value"]
        delta = None if v1 is None or v2 is None or v1 != v1 or v2 != v2 else (v2 - v1) * scale
        ci = None
        own = (m1.get("context", {}).get("ci_method") or m2.get("context", {}).get("ci_method"))
        pair, why = paired_cells(m1, m2)
        if own and m1.get("ci") and m2.get("ci") and delta is not None:
            # the sections' own intervals carry every source of noise (a TPR at 1 % FPR: members and the
            # non-members that set its threshold): the change's interval is built from them (MOVER)
            lo, hi = mover(v1, m1["ci"], v2, m2["ci"])
            ci = [lo * scale, hi * scale]
            significant = lo > 0 or hi < 0
            method = f"MOVER from the sections' own intervals ({own})"
        elif pair is not None:
            # the same points in both runs, with their per-point outcomes: the paired interval (their correlation
            # removes the noise of which points were drawn, leaving that of the flips)
            lo, hi = newcombe_paired(*pair)
            ci = [lo * scale, hi * scale]
            significant = lo > 0 or hi < 0
            method = f"paired Newcombe: {why}"
        elif m1.get("k") is not None and m2.get("k") is not None and m1.get("n") and m2.get("n"):
            lo, hi = newcombe(int(m1["k"]), int(m1["n"]), int(m2["k"]), int(m2["n"]))
            ci = [lo * scale, hi * scale]
            significant = lo > 0 or hi < 0
            method = f"unpaired Newcombe: {why}"
        elif m1.get("ci") and m2.get("ci"):
            significant = m2["ci"][0] > m1["ci"][1] or m2["ci"][1] < m1["ci"][0]
            method = "no interval of the change: significant only when the two intervals do not overlap"
        else:
            significant = False
            method = "no interval: never significant, never gated"
        riskier = None if delta is None or delta == 0 else (delta > 0) == bool(m2.get("risk_up", True))
        c = Change(key[0], key[1], m2.get("label", key[1]), m2.get("unit", "fraction"), v1, v2, delta, ci,
                   significant, riskier, interval=method)
        gate = fail_on.get(key[0])
        rated = bool(m2.get("context", {}).get("thresholds"))
        # the gate fires only when the whole interval of the change is beyond the allowed delta (issue 38): a drop
        # whose interval still reaches the allowed −X may be noise of two honest runs; no interval, no firing
        if gate is not None and rated and ci is not None and (
                (gate < 0 and ci[1] < gate) or (gate > 0 and ci[0] > gate)):
            c.gated = f"{key[0]}:{gate:+g}"
        out.append(c)
    return sorted(out, key=lambda c: (not c.gated, not c.significant, c.section, c.key))


def load_report(path: str | Path) -> dict[str, Any]:
    """A ``report.json`` (or an assessment folder holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "report.json"
    if not p.is_file():
        raise DataError(f"{p.resolve()}: report.json not found (give an assessment folder or its report.json)")
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{p}: not a JSON report ({e})") from None


def diff_reports(old: str | Path, new: str | Path, fail_on: str | None = None) -> list[Change]:
    """:func:`compare` two assessments given as folders or report.json files.

    Example:
        >>> changes = diff_reports("assess-main", "assess-pr", "robustness:-5")  # doctest: +SKIP
        >>> any(c.gated for c in changes)  # doctest: +SKIP
        False
    """
    return compare(load_report(old), load_report(new), parse_fail_on(fail_on))


def changes_to_rows(changes: list[Change]) -> list[dict[str, Any]]:
    return [asdict(c) for c in changes]
