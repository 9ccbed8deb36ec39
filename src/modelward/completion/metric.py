"""MC-hardness metric (seed 000 §3.1–3.2, Eq. 1).

- ℓ* = min_i L(θ_i) over the original curve; L(θ₀) its value at cost 0. With a smoothing window w > 1, ℓ* is the
  minimum of the trailing mean over w evaluations, so that ℓ* is a level the run held rather than one lucky
  evaluation (the curve itself — and so C — stays unsmoothed). Which split the curve is measured on (a validation
  split held out from training by default) is the problem's business (``modelward.completion.supervised``).
- thresholds ℓ*_α = α·ℓ* + (1−α)·L(θ₀);  C(ℓ) = first recorded cost with L ≤ ℓ.
- per run, two ratios:
  * capped (the paper's convention, ``value``): C'(ℓ*_α) / C(ℓ*_α), a threshold the retraining never reaches within
    its budget counts as 1.0 (flagged ``not_reached``) and a ratio above 1 is capped at 1.0 (flagged ``capped``):
    retraining from scratch (T itself) is always allowed, so MC-hardness ≤ 1 (§3.2);
  * uncapped (``raw``): C'(ℓ*_α) / C(ℓ*_α) as measured; a run that never reaches the threshold enters with its whole
    budget, budget / C(ℓ*_α) — a lower bound of its true ratio.
- C(ℓ*_α) = 0 (the untrained model already meets the threshold, e.g. α = 0) makes the ratio 0/0; we record 0.0
  (no training is needed at all) and flag it ``degenerate``.
- ``Thresholds.evals`` counts the evaluations the original needed to reach each threshold: with fewer than
  ``MIN_EVALS`` the ratio can take only a few values (it is quantised), which the report warns about.
- statistics over seeds (:func:`modelward.core.stats.summarize`): median, mean, sample SD (n−1; the paper's
  convention; undefined — NaN — for one seed), min, max, n.
"""

from __future__ import annotations

from dataclasses import dataclass

Curve = list[tuple[int, float]]

#: below this many evaluations before C(ℓ*_α), a ratio is coarsely quantised (the report warns)
MIN_EVALS = 5


def trailing_mean(curve: Curve, window: int) -> Curve:
    """The curve with each L replaced by the mean of the last `window` evaluations up to it (causal)."""
    if window <= 1:
        return list(curve)
    out = []
    for i, (c, _) in enumerate(curve):
        vals = [v for _, v in curve[max(0, i - window + 1) : i + 1]]
        out.append((c, sum(vals) / len(vals)))
    return out


def first_reach(curve: Curve, threshold: float) -> int | None:
    """C(ℓ): the first recorded cost at which L ≤ ℓ, or None if never."""
    for cost, loss in curve:
        if loss <= threshold + 1e-12:
            return int(cost)
    return None


@dataclass(frozen=True)
class Thresholds:
    """ℓ*, L(θ₀), and for each α the threshold ℓ*_α and the original cost C(ℓ*_α).

    Args:
        loss0: L(θ₀), the untrained model's loss.
        best: ℓ*, the original run's best (trailing-mean) loss.
        values: α -> ℓ*_α = α ℓ* + (1 − α) L(θ₀).
        costs: α -> C(ℓ*_α), the original run's cost to first reach ℓ*_α.
        evals: α -> evaluations up to and including C(ℓ*_α).

    Returns:
        Built with :meth:`from_curve` from an original run's curve.

    Example:
        >>> t = Thresholds.from_curve([(0, 0.9), (10, 0.5), (20, 0.3)], [0.5, 1.0])
        >>> t.values[0.5], t.costs
        (0.6, {0.5: 10, 1.0: 20})
    """

    loss0: float
    best: float
    values: dict[float, float]
    costs: dict[float, int]
    evals: dict[float, int] | None = None  # evaluations after θ₀ up to and including C(ℓ*_α)

    @classmethod
    def from_curve(cls, curve: Curve, alphas: list[float], smoothing: int = 1) -> Thresholds:
        """Args: curve [(cost, L)] from cost 0; alphas; smoothing (window w of the trailing mean for ℓ*).
        Example: ``Thresholds.from_curve([(0, .9), (10, .5), (20, .3)], [1.0]).costs == {1.0: 20}``."""
        if not curve or curve[0][0] != 0:
            raise ValueError("the original curve must start with L(θ₀) at cost 0")
        loss0 = curve[0][1]
        best = min(v for _, v in trailing_mean(curve, smoothing))
        values = {a: a * best + (1.0 - a) * loss0 for a in alphas}
        costs, evals = {}, {}
        for a, thr in values.items():
            c = first_reach(curve, thr)
            # ℓ*_α ≥ ℓ* ≥ the smallest L of the window that attains ℓ*: the original run reaches it
            assert c is not None
            costs[a] = c
            evals[a] = next(i for i, (cost, _) in enumerate(curve) if cost == c)
        return cls(loss0, best, values, costs, evals)

    @property
    def learned(self) -> bool:
        """False when training never improved on the untrained model (nothing to complete)."""
        return self.best < self.loss0


@dataclass(frozen=True)
class Ratio:
    value: float  # capped at 1 (not reached = 1)
    reached: bool
    capped: bool  # reached, but later than the original (uncapped ratio > 1)
    degenerate: bool
    retrain_cost: int | None
    raw: float = float("nan")  # uncapped; not reached = budget / C (a lower bound)


def hardness_ratio(retrain_curve: Curve, threshold: float, original_cost: int, budget: int | None = None) -> Ratio:
    """One run's C'(ℓ*_α) / C(ℓ*_α), capped and uncapped, with the conventions in the module docstring.

    Args: retrain_curve; threshold ℓ*_α; original_cost C(ℓ*_α); budget (the retraining budget; default: the last
    recorded cost of the curve).
    Example: ``hardness_ratio([(0, .9), (30, .2)], .3, 20).raw == 1.5`` (capped value 1.0, ``capped`` True).
    """
    c_new = first_reach(retrain_curve, threshold)
    if c_new is None:
        spent = budget if budget is not None else (retrain_curve[-1][0] if retrain_curve else 0)
        raw = 1.0 if original_cost == 0 else max(spent, 0) / original_cost
        return Ratio(1.0, False, False, original_cost == 0, None, raw)
    if original_cost == 0:
        v = 0.0 if c_new == 0 else 1.0
        return Ratio(v, True, c_new > 0, True, c_new, v)
    r = c_new / original_cost
    return Ratio(min(r, 1.0), True, r > 1.0, False, c_new, r)
