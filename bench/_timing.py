"""Shared by the bench scripts (run as `python bench/<script>.py`, so this folder is on sys.path)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_time(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of `repeats` calls of `fn`, after one untimed warm-up call."""
    fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)
