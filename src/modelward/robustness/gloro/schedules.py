"""ε and TRADES-λ schedules (seed 002 App. A.4).

- ``single``: the final value throughout.
- ``linear`` (the thesis' ``x,y,e``): ``v_t = x + (y − x)·t/e`` for t ≤ e, then y.
- ``log``: logarithmic (concave) increase from x to y, reached at e; the reference library's interpolation
  ``v_t = log((exp(y) − exp(x))·t/e + exp(x))``.

``t`` is a (fractional) epoch, so values can move within an epoch per batch as in the reference library.
``until`` is the fraction of training at which the final value is reached (the thesis' schedules end half-way).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from modelward.core.config import StrictModel

ScheduleKind = Literal["single", "linear", "log"]


class Schedule(StrictModel):
    """A value ramped from ``start`` to ``end`` (reached at ``until`` × total epochs)."""

    kind: ScheduleKind = "single"
    start: float = 0.0
    end: float = Field(1.0, ge=0.0)
    until: float = Field(0.5, gt=0.0, le=1.0)

    def at(self, t: float, epochs: int) -> float:
        """Value at (fractional) epoch ``t`` of ``epochs``."""
        if self.kind == "single":
            return self.end
        e = max(self.until * epochs, 1e-12)
        frac = min(max(t / e, 0.0), 1.0)
        if self.kind == "linear":
            return self.start + (self.end - self.start) * frac
        a, b = math.exp(self.start), math.exp(self.end)
        return math.log((b - a) * frac + a)


def decay_to(lr: float, lb: float, t: float, epochs: int) -> float:
    """``decay_to_lb`` (App. A.4): constant until half-way, then exponential decay reaching ``lb`` at the end."""
    half = epochs / 2
    if t <= half or lb <= 0 or lb >= lr:
        return lr
    frac = min((t - half) / max(epochs - half, 1e-12), 1.0)
    return lr * (lb / lr) ** frac
