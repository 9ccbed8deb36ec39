"""The one summary statistic over seeds: median, mean, sample SD (n − 1), min, max, n; and the interval helpers
every area shares: Wilson's score interval of a proportion, Newcombe's interval of a difference of two proportions
and the MOVER interval of a difference of any two independent estimates from their own intervals; Newcombe's paired
interval of a difference of two proportions measured on the same units.

Example:
    >>> s = summarize([0.4, 0.5, 0.6])
    >>> round(s.mean, 3), round(s.sd, 3), s.n
    (0.5, 0.1, 3)
    >>> mean_sd_text([0.4, 0.5, 0.6])
    '0.50 ± 0.10'
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


@dataclass(frozen=True)
class Summary:
    """Statistics of a list of values. ``sd`` is the sample SD (n − 1), NaN (undefined) for n < 2; every field
    but ``n`` is NaN for n = 0."""

    median: float
    mean: float
    sd: float
    min: float
    max: float
    n: int

    def as_dict(self, prefix: str = "") -> dict[str, float | int]:
        """``{prefix+"median": ..., "mean", "sd", "min", "max", "n"}`` in that order (table columns)."""
        return {f"{prefix}{k}": getattr(self, k) for k in ("median", "mean", "sd", "min", "max", "n")}


def summarize(values: Iterable[float | None], *, skip_missing: bool = False) -> Summary:
    """Summarize `values` (e.g. one metric over seeds).

    Args:
        values: the numbers. The mean is ``statistics.fmean`` (correctly rounded) and the SD ``statistics.stdev``.
        skip_missing: drop None and NaN first (e.g. a metric a remote victim cannot report).

    Returns:
        A :class:`Summary`.
    """
    vals = [float(v) for v in values if not (skip_missing and _missing(v))]  # type: ignore[arg-type]
    n = len(vals)
    if n == 0:
        nan = math.nan
        return Summary(nan, nan, nan, nan, nan, 0)
    return Summary(statistics.median(vals), statistics.fmean(vals), statistics.stdev(vals) if n > 1 else math.nan,
                   min(vals), max(vals), n)


def mean_sd_text(values: Iterable[float | None] | Summary, digits: int = 2, *, sd_digits: int | None = None,
                 scale: float = 1.0, unit: str = "", missing: str = "—") -> str:
    """``"0.42 ± 0.03"``: the mean, and ± the sample SD when there are at least two values.

    Args:
        values: the numbers (None/NaN are skipped) or a ready :class:`Summary`.
        digits: decimals of the mean; ``sd_digits`` those of the SD (default: `digits`).
        scale: multiply both (e.g. 100 for percent); ``unit`` is appended to the mean (e.g. ``"%"``).
        missing: the text when there is no value.
    """
    s = values if isinstance(values, Summary) else summarize(values, skip_missing=True)
    if s.n == 0:
        return missing
    text = f"{scale * s.mean:.{digits}f}{unit}"
    if s.n > 1 and not math.isnan(s.sd):
        text += f" ± {scale * s.sd:.{digits if sd_digits is None else sd_digits}f}"
    return text


Z95 = 1.959963984540054  # the standard normal's 97.5 % quantile


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of k successes in n trials (Wilson 1927).

    Example:
        >>> [round(v, 4) for v in wilson(0, 10)]
        [0.0, 0.2775]
    """
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, centre - half), min(1.0, centre + half)


def mover(d1: float, ci1: tuple[float, float] | list[float], d2: float,
          ci2: tuple[float, float] | list[float]) -> tuple[float, float]:
    """Interval of ``d2 − d1`` for two *independent* estimates from their own intervals: the MOVER method
    ("method of variance estimates recovery", Zou & Donner 2008), of which Newcombe's hybrid score interval is the
    case of two Wilson intervals. Each side's width is recovered from the distance between the estimate and the
    matching end of its interval, so asymmetric intervals (a rate near 0, a TPR at a low FPR whose threshold is
    itself estimated) keep their shape.

    Args:
        d1, ci1: the first (older) estimate and its interval.
        d2, ci2: the second (newer) estimate and its interval (same confidence level).

    Returns:
        ``(lower, upper)`` of ``d2 − d1``.

    Example:
        >>> lo, hi = mover(0.5, (0.4, 0.6), 0.5, (0.4, 0.6))
        >>> round(lo, 4), round(hi, 4)
        (-0.1414, 0.1414)
    """
    d = d2 - d1
    lo = d - math.sqrt((d2 - ci2[0]) ** 2 + (ci1[1] - d1) ** 2)
    hi = d + math.sqrt((ci2[1] - d2) ** 2 + (d1 - ci1[0]) ** 2)
    return lo, hi


def newcombe(k1: int, n1: int, k2: int, n2: int, z: float = Z95) -> tuple[float, float]:
    """95 % interval of p2 − p1 for two independent proportions (Newcombe 1998, hybrid score method 10).

    Example:
        >>> lo, hi = newcombe(50, 100, 50, 100)
        >>> lo < 0 < hi
        True
    """
    return mover(k1 / n1, wilson(k1, n1, z), k2 / n2, wilson(k2, n2, z))


def newcombe_paired(a: int, b: int, c: int, d: int, z: float = Z95) -> tuple[float, float]:
    """95 % interval of p2 − p1 for two proportions measured on the *same* n = a + b + c + d units (Newcombe 1998,
    "Improved confidence intervals for the difference between binomial proportions based on paired data", Stat. Med.
    17:2635, method 10: Wilson intervals of both margins combined with the phi correlation of the 2×2 table).

    The cells count the units by outcome in the first and second measurement: ``a`` success in both, ``b`` success
    only in the first, ``c`` only in the second, ``d`` in neither; so p1 = (a + b)/n and p2 = (a + c)/n. On the
    same points the two runs are positively correlated and the interval is much narrower than the unpaired
    :func:`newcombe` (what lets a gate see a real drop of a few points on a few hundred points).

    Example:
        >>> lo, hi = newcombe_paired(80, 0, 0, 20)  # identical outcomes: a narrow interval around 0
        >>> round(lo, 4), round(hi, 4)
        (-0.0222, 0.0222)
        >>> lo, hi = newcombe_paired(70, 10, 2, 18)  # 8 more points lost than gained
        >>> lo < -0.08 < hi < 0
        True
    """
    n = a + b + c + d
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson(a + b, n, z)
    l2, u2 = wilson(a + c, n, z)
    den = (a + b) * (c + d) * (a + c) * (b + d)
    phi = (a * d - b * c) / math.sqrt(den) if den > 0 else 0.0
    diff = p2 - p1
    lo = diff - math.sqrt(max(0.0, (p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2))
    hi = diff + math.sqrt(max(0.0, (u2 - p2) ** 2 - 2 * phi * (u2 - p2) * (p1 - l1) + (p1 - l1) ** 2))
    return max(-1.0, lo), min(1.0, hi)
