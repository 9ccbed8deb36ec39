"""Compare two assessments of a model (``modelward assess diff OLD NEW --fail-on robustness:-5,privacy:+2``).

Metrics are matched by section and key. What counts as a *change* is decided by intervals, not by the point
estimates: for two proportions counted as k of n (accuracies, TPRs) the 95 % interval of their difference is
Newcombe's hybrid score interval (Newcombe 1998, method 10: from the two Wilson score intervals); a change is
significant when that interval excludes 0. Other numbers (ratios, MC-hardness over seeds) change significantly when
their own intervals do not overlap; numbers without an interval never count as significant changes.

A gate ``SECTION:±X`` fails when a metric of that section with a verdict rule moved significantly by at least X in
the stated direction: ``robustness:-5`` fails on a drop of 5 points or more, ``privacy:+2`` on a rise of 2 points or
more (fractions are in percentage points, other units raw). Gating on significant changes only is what keeps
re-runs of the same assessment from raising alarms.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from modelward.errors import ConfigError, DataError

Z95 = 1.959963984540054


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of k successes in n trials."""
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return centre - half, centre + half


def newcombe(k1: int, n1: int, k2: int, n2: int, z: float = Z95) -> tuple[float, float]:
    """95 % interval of p2 − p1 (Newcombe 1998, hybrid score method 10).

    Example:
        >>> lo, hi = newcombe(50, 100, 50, 100)
        >>> lo < 0 < hi
        True
    """
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson(k1, n1, z)
    l2, u2 = wilson(k2, n2, z)
    d = p2 - p1
    return (d - math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2), d + math.sqrt((u2 - p2) ** 2 + (p1 - l1) ** 2))


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
        scale = 100.0 if m2.get("unit", "fraction") == "fraction" else 1.0
        v1, v2 = m1["value"], m2["value"]
        delta = None if v1 is None or v2 is None or v1 != v1 or v2 != v2 else (v2 - v1) * scale
        ci = None
        if m1.get("k") is not None and m2.get("k") is not None and m1.get("n") and m2.get("n"):
            lo, hi = newcombe(int(m1["k"]), int(m1["n"]), int(m2["k"]), int(m2["n"]))
            ci = [lo * scale, hi * scale]
            significant = lo > 0 or hi < 0
        elif m1.get("ci") and m2.get("ci"):
            significant = m2["ci"][0] > m1["ci"][1] or m2["ci"][1] < m1["ci"][0]
        else:
            significant = False
        riskier = None if delta is None or delta == 0 else (delta > 0) == bool(m2.get("risk_up", True))
        c = Change(key[0], key[1], m2.get("label", key[1]), m2.get("unit", "fraction"), v1, v2, delta, ci,
                   significant, riskier)
        gate = fail_on.get(key[0])
        rated = bool(m2.get("context", {}).get("thresholds"))
        if gate is not None and rated and significant and delta is not None and (
                (gate < 0 and delta <= gate + 1e-9) or (gate > 0 and delta >= gate - 1e-9)):  # float slack
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
