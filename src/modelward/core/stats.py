"""The one summary statistic over seeds: median, mean, sample SD (n − 1), min, max, n.

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
