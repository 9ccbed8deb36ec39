"""MC-hardness metric (seed 000 §3.1–3.2, Eq. 1).

- ℓ* = min_i L(θ_i) over the original curve; L(θ₀) its value at cost 0.
- thresholds ℓ*_α = α·ℓ* + (1−α)·L(θ₀);  C(ℓ) = first recorded cost with L ≤ ℓ.
- per run: ratio C'(ℓ*_α) / C(ℓ*_α). A threshold the retraining never reaches within its budget gives 1.0 and is
  flagged ``not_reached``: retraining from scratch (T itself) is always allowed, so MC-hardness ≤ 1 (§3.2). For the
  same reason a ratio above 1 is capped at 1.0 (flagged ``capped``).
- C(ℓ*_α) = 0 (the untrained model already meets the threshold, e.g. α = 0) makes the ratio 0/0; we record 0.0
  (no training is needed at all) and flag it ``degenerate``.
- statistics over seeds (:func:`modelward.core.stats.summarize`): median, mean, sample SD (n−1; the paper's
  convention; undefined — NaN — for one seed), min, max, n.
"""

from __future__ import annotations

from dataclasses import dataclass

Curve = list[tuple[int, float]]


def first_reach(curve: Curve, threshold: float) -> int | None:
    """C(ℓ): the first recorded cost at which L ≤ ℓ, or None if never."""
    for cost, loss in curve:
        if loss <= threshold + 1e-12:
            return int(cost)
    return None


@dataclass(frozen=True)
class Thresholds:
    """ℓ*, L(θ₀), and for each α the threshold ℓ*_α and the original cost C(ℓ*_α)."""

    loss0: float
    best: float
    values: dict[float, float]
    costs: dict[float, int]

    @classmethod
    def from_curve(cls, curve: Curve, alphas: list[float]) -> Thresholds:
        if not curve or curve[0][0] != 0:
            raise ValueError("the original curve must start with L(θ₀) at cost 0")
        loss0 = curve[0][1]
        best = min(v for _, v in curve)
        values = {a: a * best + (1.0 - a) * loss0 for a in alphas}
        costs = {}
        for a, thr in values.items():
            c = first_reach(curve, thr)
            assert c is not None  # ℓ*_α ≥ ℓ* is always reached by the original run
            costs[a] = c
        return cls(loss0, best, values, costs)

    @property
    def learned(self) -> bool:
        """False when training never improved on the untrained model (nothing to complete)."""
        return self.best < self.loss0


@dataclass(frozen=True)
class Ratio:
    value: float
    reached: bool
    capped: bool
    degenerate: bool
    retrain_cost: int | None


def hardness_ratio(retrain_curve: Curve, threshold: float, original_cost: int) -> Ratio:
    """One run's C'(ℓ*_α) / C(ℓ*_α) with the conventions in the module docstring."""
    c_new = first_reach(retrain_curve, threshold)
    if c_new is None:
        return Ratio(1.0, False, False, original_cost == 0, None)
    if original_cost == 0:
        return Ratio(0.0 if c_new == 0 else 1.0, True, c_new > 0, True, c_new)
    r = c_new / original_cost
    return Ratio(min(r, 1.0), True, r > 1.0, False, c_new)
