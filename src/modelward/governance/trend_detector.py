"""Trend detection: sustained damage to the label holder's fit, caught by a CUSUM on the rows it trains on.

**What the label holder can measure that the sender cannot keep looking normal.** Bob sees only what Alice sends;
he cannot tell a real activation from a forged one. But he holds the labels, and before each step trains on a batch
he scores it with his current part: the per-row losses ``ℓ_i`` of the rows about to be trained on (the step computes
them anyway). To lower Bob's accuracy on honest inputs, Alice must either send rows whose pair (activation, Bob's
label) disagrees with what Bob's part has learnt — such a row's loss is high while Bob's part is still good (a row
carrying another image's activation: 5–15 nats against 10⁻³ for an honest row of a trained part) — or damage
Bob's part so that honest rows' losses rise. Either way Bob's losses on the rows she sends rise, and she cannot
tell which rows are watched: every row is. Keeping the losses normal needs rows that agree with Bob's labels,
hence knowledge of the labels (protected: ``[label_protection]``) — and such rows (nearly) agree with what Bob
already predicts, so they carry small gradients (and per-row clipping, :mod:`.bounded_influence`, cuts those that
do not). What stays invisible is what does not raise the loss of the rows Alice sends: a backdoor whose trigger
only appears later (measured in docs/governance.md), or damage on inputs unlike the ones she sends in training.

**The statistic.** Each row counts ``s_i = min(ℓ_i, log K) / log K`` (K classes): 1 for a row Bob's part gets no
better than chance, about 0 for a row it fits; the step's count is ``x = Σ s_i`` (in rows). Honest late training
has x ≈ 0.01; one forged row adds about 1. A one-sided CUSUM for a rise of the rate of such rows from λ₀ to
λ₀ + δ (Page 1954; the Poisson log-likelihood ratio of Lucas 1985):

    S_t = max(0, S_{t−1} + x_t · log(λ₁/λ₀) − (λ₁ − λ₀)),   λ₀ = max(λ̂, floor),  λ₁ = λ₀ + max(δ, c·√λ₀)

alarms when ``S_t > h`` (``threshold``). λ̂ is an exponential average of x over the steps in control (S = 0): a
rise is not absorbed into the reference while it is being accumulated, and honest training, whose rate only falls,
keeps it current. For counts that are Poisson with the estimated rate, the average run length between false alarms
is at least about ``e^h`` (Wald's bound; ``h = 15``: 3·10⁶ steps); the measured rate on long honest runs is in
docs/governance.md. The detector arms after ``warmup_steps``; before, the reference is learnt.

**The change point.** If S was 0 after the rows of step s, every step up to s trained on rows in control: the state
after step s (before step s + 1) is the "last good" state, to which the party rolls back after an alarm
(:mod:`.integrity`).

Example:
    >>> det = TrendDetector(TrendConfig(), num_classes=10, warmup_steps=2)
    >>> for s in range(5):
    ...     assert det.observe(s, torch.full((64,), 1e-3)) is None
    >>> alarm = None
    >>> for s in range(5, 20):
    ...     alarm = alarm or det.observe(s, torch.cat([torch.full((61,), 1e-3), torch.full((3,), 9.0)]))
    >>> alarm.step, alarm.good_step
    (6, 5)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import Field

from modelward.core.config import StrictModel


class TrendConfig(StrictModel):
    """``[integrity.trend]``: the CUSUM of the label holder's per-row losses (module docstring).

    Args:
        enabled: watch at all (default true; the label holder only).
        decay: decay per step of the reference rate λ̂ (steps in control only).
        shift_rows / shift_sd: δ = max(shift_rows, shift_sd·√λ₀), the rise of the rate of badly fitted rows the
            test is tuned to (rows per step): one row where the part fits nearly everything, a rise of shift_sd
            Poisson standard deviations where it does not (early training, a weak part).
        threshold: h, the alarm level of S (false alarms about every e^h steps at most, for Poisson counts).
        floor_rows: the least reference rate λ₀ (rows per step): a part that fits everything still sees the odd
            hard row.

    Example:
        >>> TrendConfig().threshold
        15.0
    """

    enabled: bool = True
    decay: float = Field(0.98, gt=0.0, lt=1.0)
    shift_rows: float = Field(2.0, gt=0.0)
    shift_sd: float = Field(2.0, ge=0.0)
    threshold: float = Field(15.0, gt=0.0)
    floor_rows: float = Field(0.05, gt=0.0)
    window: int = Field(20, ge=2)


@dataclass
class Alarm:
    """An alarm: the step whose rows raised S past the threshold, S, the reference rate, the step's count, and the
    good step: the state before it was trained on rows in control only."""

    step: int
    statistic: float
    reference_rows: float
    rows: float
    good_step: int

    def describe(self) -> str:
        return (f"the rows the previous party sent fit the labels ever worse: CUSUM {self.statistic:.1f} above its "
                f"threshold (badly fitted rows per batch: {self.rows:.2f} in step {self.step}, reference "
                f"{self.reference_rows:.2f}); in control up to step {self.good_step}")


class TrendDetector:
    """The CUSUM of the module docstring, one step at a time.

    Args:
        cfg: :class:`TrendConfig`.
        num_classes: K (the per-row score saturates at log K).
        warmup_steps: steps that only teach the reference.

    Returns:
        :meth:`observe` returns an :class:`Alarm` or None; :meth:`state` / :meth:`load_state` keep it in a
        checkpoint.

    Example:
        >>> TrendDetector(TrendConfig(), num_classes=2).state()["S"]
        0.0
    """

    def __init__(self, cfg: TrendConfig, num_classes: int, warmup_steps: int = 20) -> None:
        self.cfg, self.warmup_steps = cfg, warmup_steps
        self.saturation = math.log(max(2, num_classes))
        self.rate: float | None = None  # λ̂
        self.S = 0.0
        self.seen = 0
        self.good_step = 0
        self.max_S = 0.0
        self.recent: list[float] = []  # the last `window` counts

    def reference(self) -> float:
        """λ̂: the slow average, or, where lower, an upper confidence bound of the last ``window`` steps' mean
        (after a fall of the rate, early in training, the slow average lags above it)."""
        if self.rate is None:
            return 0.0
        if len(self.recent) < self.cfg.window:
            return self.rate
        m = sum(self.recent) / len(self.recent)
        return min(self.rate, m + 3.0 * math.sqrt(max(m, self.cfg.floor_rows) / len(self.recent)))

    def count(self, losses: torch.Tensor) -> float:
        """``x = Σ min(ℓ_i, log K) / log K`` (a non-finite loss counts as a row fitted no better than chance)."""
        u = self.saturation
        return float(losses.detach().float().nan_to_num(u, u, u).clamp(0.0, u).sum()) / u

    def observe(self, step: int, losses: torch.Tensor) -> Alarm | None:
        """Add the per-row losses of step `step` (before its update). Returns an :class:`Alarm` when S passes the
        threshold (and keeps S, so every later step alarms too until the state is reset)."""
        if not self.cfg.enabled:
            return None
        x = self.count(losses)
        self.seen += 1
        if self.rate is None:
            self.rate, self.good_step = x, step + 1
            return None
        armed = self.seen > self.warmup_steps
        if armed:
            l0 = max(self.reference(), self.cfg.floor_rows)
            l1 = l0 + max(self.cfg.shift_rows, self.cfg.shift_sd * math.sqrt(l0))
            self.S = max(0.0, self.S + x * math.log(l1 / l0) - (l1 - l0))
            self.max_S = max(self.max_S, self.S)
        if self.S == 0.0:
            self.good_step = step + 1
        d = self.cfg.decay
        self.rate = d * self.rate + (1 - d) * x
        self.recent = (self.recent + [x])[-self.cfg.window:]
        if armed and self.S > self.cfg.threshold:
            return Alarm(step, self.S, max(self.reference(), self.cfg.floor_rows), x, self.good_step)
        return None

    def state(self) -> dict[str, Any]:
        return {"rate": self.rate, "S": self.S, "seen": self.seen, "good_step": self.good_step,
                "max_S": self.max_S, "recent": list(self.recent)}

    def load_state(self, state: dict[str, Any]) -> None:
        self.rate = None if state.get("rate") is None else float(state["rate"])
        self.S = float(state.get("S", 0.0))
        self.seen = int(state.get("seen", 0))
        self.good_step = int(state.get("good_step", 0))
        self.max_S = float(state.get("max_S", 0.0))
        self.recent = [float(v) for v in state.get("recent", [])]
