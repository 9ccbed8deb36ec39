"""Empirical ε lower bounds from a membership attack's (scores, membership) arrays.

An (ε, δ)-DP training algorithm bounds every membership test (Kairouz et al. 2015; Jagielski, Ullman & Oprea 2020,
"Auditing Differentially Private Machine Learning: How Private is Private SGD?", arXiv:2006.07709):

    TPR ≤ e^ε · FPR + δ        and        TNR ≤ e^ε · FNR + δ,

so at any threshold ``ε ≥ log((TPR − δ) / FPR)`` and ``ε ≥ log((TNR − δ) / FNR)``. TPR and FPR are only
estimated from finitely many members / non-members, so the bound uses a one-sided lower confidence bound on the
*ratio* of the two binomial proportions. The methods and their formulas are those of TensorFlow Privacy's
``privacy_tests/epsilon_lower_bound.py`` (written here from its description; z = Φ⁻¹(α), α = 1 − confidence;
x₁ of n₁ "positives" with rate p₁ = x₁/n₁, x₀ of n₀ "negatives" with rate p₀ = x₀/n₀, q = 1 − p):

* ``clopper-pearson`` (Jagielski et al. 2020): exact Clopper–Pearson intervals on each proportion, α/2 each:
  p₁ ≥ Beta⁻¹(α/2; x₁, n₁ − x₁ + 1), p₀ ≤ Beta⁻¹(1 − α/2; x₀ + 1, n₀ − x₀), ratio ≥ (p₁,lo − δ) / p₀,hi.
  The only method that takes δ > 0; its joint confidence is ≥ 1 − α by the union bound.
* ``katz-log`` (Katz et al. 1978; used for MIA by Stock et al. 2022, arXiv:2210.08643):
  ratio ≥ (p₁/p₀) · exp(z · √(q₁/x₁ + q₀/x₀)), with x₀ = 0 replaced by ½.
* ``adjusted-log`` (Walter 1975): log((x₁+½)/(n₁+½)) − log((x₀+½)/(n₀+½)) + z · √(1/(x₁+½) − 1/(n₁+½)
  + 1/(x₀+½) − 1/(n₀+½)).
* ``bailey`` (Bailey 1987): (p₁/p₀) · [(1 + (z/3)√(q₁/x₁ + q₀/x₀ − z² q₁ q₀ / (9 x₁ x₀))) / (1 − z² q₀ / (9 x₀))]³.
* ``inv-sinh`` (Newcombe 2001): (x₁/x₀)/(n₁/n₀) · exp(2 asinh((z/2) √(1/x₁ − 1/n₁ + 1/x₀ − 1/n₀))), x₀ = 0 → z².

(For the ratio methods, the case x₁ = n₁ and x₀ = n₀ uses n − ½, and x₁ = 0 gives the trivial bound 0, as in
TF Privacy; the method references are those TF Privacy cites: Fagerland et al. 2015, doi:10.1111/2041-210X.12304.)

:func:`epsilon_lower_bound` evaluates every threshold (member iff score ≥ t, ties together), both ratios
TPR/FPR and TNR/FNR (``two_sided=True`` also FPR/TPR and FNR/TNR, for attacks whose score direction is unknown),
and returns the largest ``log`` bound, floored at 0. **The maximum over thresholds is chosen after looking at the
data**, as TF Privacy's top-k bound is: it is the bound an auditor reports for the best attack threshold, not a
simultaneous 95 % statement. For a bound with exactly the stated confidence, fix the threshold on other data and
pass it as ``threshold``, or use the one-run DP audit (:mod:`modelward.privacy.dp_audit`).
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from scipy import stats

from modelward.errors import ConfigError, DataError

BoundMethod = Literal["clopper-pearson", "katz-log", "adjusted-log", "bailey", "inv-sinh"]
METHODS: tuple[str, ...] = ("clopper-pearson", "katz-log", "adjusted-log", "bailey", "inv-sinh")


def _check_args(confidence: float, delta: float, method: str) -> float:
    if method not in METHODS:
        raise ConfigError(f"epsilon_lower_bound: unknown method {method!r}; valid choices: {list(METHODS)}")
    if not 0.5 < confidence < 1.0:
        raise ConfigError(f"epsilon_lower_bound: confidence must lie in (0.5, 1), got {confidence}")
    if not 0.0 <= delta < 1.0:
        raise ConfigError(f"epsilon_lower_bound: delta must lie in [0, 1), got {delta}")
    if delta > 0 and method != "clopper-pearson":
        raise ConfigError(f"epsilon_lower_bound: method {method!r} bounds a ratio of proportions and is defined "
                          "for delta = 0 only; use method='clopper-pearson' with delta > 0")
    return 1.0 - confidence


def ratio_lower_bound(x1: np.ndarray | int, n1: int, x0: np.ndarray | int, n0: int, *,
                      method: BoundMethod = "clopper-pearson", confidence: float = 0.95,
                      delta: float = 0.0) -> np.ndarray:
    """Lower confidence bound on (p₁ − δ)/p₀ for x₁ ~ Bin(n₁, p₁), x₀ ~ Bin(n₀, p₀) (formulas in the module doc).

    Args:
        x1, n1: successes and trials of the numerator proportion (e.g. true positives, members).
        x0, n0: successes and trials of the denominator proportion (e.g. false positives, non-members).
        method: one of :data:`METHODS`; confidence: 1 − α; delta: subtracted from p₁ (clopper-pearson only).

    Returns:
        the bounds (array, same shape as ``x1``); 0 where the data support no bound.

    Example:
        >>> ratio_lower_bound(np.array([100, 90]), 110, np.array([10, 5]), 80, method="katz-log").round(4).tolist()
        [4.4596, 6.3971]
    """
    alpha = _check_args(confidence, delta, method)
    x1o = np.atleast_1d(np.asarray(x1, dtype=np.float64))
    x0o = np.atleast_1d(np.asarray(x0, dtype=np.float64))
    if x1o.shape != x0o.shape:
        raise DataError(f"ratio_lower_bound: x1 {x1o.shape} and x0 {x0o.shape} differ in shape")
    if n1 <= 0 or n0 <= 0 or (x1o < 0).any() or (x1o > n1).any() or (x0o < 0).any() or (x0o > n0).any():
        raise DataError(f"ratio_lower_bound: need 0 ≤ x1 ≤ n1 = {n1} and 0 ≤ x0 ≤ n0 = {n0}, both n > 0")
    z = float(stats.norm.ppf(alpha))  # negative: a lower bound
    with np.errstate(divide="ignore", invalid="ignore"):
        if method == "clopper-pearson":
            p1 = np.where(x1o > 0, stats.beta.ppf(alpha / 2, x1o, n1 - x1o + 1), 0.0)
            p0 = np.where(x0o < n0, stats.beta.ppf(1 - alpha / 2, x0o + 1, n0 - x0o), 1.0)
            num = p1 - delta
            return np.where((num <= 0) | (p0 <= 0), 0.0, num / np.where(p0 > 0, p0, 1.0))
        both_max = (x1o == n1) & (x0o == n0)
        xa = np.where(both_max, n1 - 0.5, x1o)
        xb = np.where(both_max, n0 - 0.5, x0o)
        if method == "katz-log":
            xb = np.where(xb == 0, 0.5, xb)
            p1, p0 = xa / n1, xb / n0
            out = (p1 / p0) * np.exp(z * np.sqrt((1 - p1) / xa + (1 - p0) / xb))
            return np.where(xa == 0, 0.0, out)
        if method == "adjusted-log":
            log_ratio = np.log((xa + 0.5) / (n1 + 0.5)) - np.log((xb + 0.5) / (n0 + 0.5))
            half = np.sqrt(1 / (xa + 0.5) - 1 / (n1 + 0.5) + 1 / (xb + 0.5) - 1 / (n0 + 0.5))
            return np.where((xa == 0) & (xb == 0), 0.0, np.exp(log_ratio + z * half))
        if method == "bailey":
            xa = np.where(x1o == n1, n1 - 0.5, x1o)
            xb = np.where(x0o == n0, n0 - 0.5, x0o)
            xb = np.where(xb == 0, 0.5, xb)
            p1, p0 = xa / n1, xb / n0
            q1, q0 = 1 - p1, 1 - p0
            numer = 1 + z / 3 * np.sqrt(q1 / xa + q0 / xb - z**2 * q1 * q0 / (9 * xa * xb))
            denom = 1 - z**2 * q0 / (9 * xb)
            return np.where(x1o == 0, 0.0, (p1 / p0) * (numer / denom) ** 3)
        # inv-sinh
        xb = np.where(xb == 0, z**2, xb)
        ratio = (xa / xb) / (n1 / n0)
        inner = z / 2 * np.sqrt(1 / xa - 1 / n1 + 1 / xb - 1 / n0)
        return np.where(xa == 0, 0.0, ratio * np.exp(2 * np.arcsinh(inner)))


def check_scores(scores: np.ndarray, membership: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float64 scores, bool membership), both flat; unequal lengths or NaN scores are a DataError."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    m = np.asarray(membership).astype(bool).reshape(-1)
    if s.shape != m.shape:
        raise DataError(f"scores ({s.shape[0]}) and membership labels ({m.shape[0]}) differ in length")
    if np.isnan(s).any():
        raise DataError("membership scores contain NaN")
    return s, m


def threshold_counts(scores: np.ndarray, membership: np.ndarray,
                     threshold: float | None = None) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(tp, fp, P, N) at every distinct threshold (member iff score ≥ t; ties move together), or at ``threshold``.

    Example:
        >>> threshold_counts(np.array([0.9, 0.5, 0.1]), np.array([1, 0, 0]))[:2]
        (array([0, 1, 1, 1]), array([0, 0, 1, 2]))
    """
    s, m = check_scores(scores, membership)
    P, N = int(m.sum()), int((~m).sum())
    if P == 0 or N == 0:
        raise DataError(f"an ε lower bound needs both members and non-members (got {P} and {N})")
    if threshold is not None:
        pred = s >= threshold
        return np.array([int((pred & m).sum())]), np.array([int((pred & ~m).sum())]), P, N
    order = np.argsort(-s, kind="mergesort")
    s, m = s[order], m[order]
    last = np.r_[np.nonzero(np.diff(s))[0], len(s) - 1]
    tp = np.r_[0, np.cumsum(m)[last]]
    fp = np.r_[0, np.cumsum(~m)[last]]
    return tp, fp, P, N


def epsilon_lower_bounds(scores: np.ndarray, membership: np.ndarray, *, delta: float = 0.0,
                         confidence: float = 0.95, method: BoundMethod = "clopper-pearson",
                         two_sided: bool = False, threshold: float | None = None) -> np.ndarray:
    """The ε lower bound at every threshold (the larger of the TPR/FPR and TNR/FNR bounds; ≥ 0).

    Args: as :func:`epsilon_lower_bound`.
    Returns: one bound per threshold of :func:`threshold_counts`.
    Example:
        >>> epsilon_lower_bounds(np.array([0.9, 0.1]), np.array([1, 0])).shape
        (3,)
    """
    _check_args(confidence, delta, method)
    tp, fp, P, N = threshold_counts(scores, membership, threshold)
    fn, tn = P - tp, N - fp
    pairs = [(tp, P, fp, N), (tn, N, fn, P)]
    if two_sided:
        pairs += [(fp, N, tp, P), (fn, P, tn, N)]
    ratios = np.stack([ratio_lower_bound(a, na, b, nb, method=method, confidence=confidence, delta=delta)
                       for a, na, b, nb in pairs])
    with np.errstate(divide="ignore"):
        logs = np.where(ratios > 0, np.log(np.where(ratios > 0, ratios, 1.0)), 0.0)
    return np.maximum(logs.max(axis=0), 0.0)


def epsilon_lower_bound(scores: np.ndarray, membership: np.ndarray, *, delta: float = 0.0,
                        confidence: float = 0.95, method: BoundMethod = "clopper-pearson",
                        two_sided: bool = False, threshold: float | None = None) -> float:
    """The best empirical ε lower bound over thresholds from a membership attack's scores.

    Args:
        scores: per-example attack scores (higher = member).
        membership: the true membership (bool), same length.
        delta: the δ of the (ε, δ) claim being audited (clopper-pearson only for δ > 0).
        confidence: the confidence level of each threshold's bound (default 95 %).
        method: ``clopper-pearson`` (default), ``katz-log``, ``adjusted-log``, ``bailey`` or ``inv-sinh``.
        two_sided: also try the reversed score direction (FPR/TPR, FNR/TNR).
        threshold: evaluate only this threshold (member iff score ≥ threshold) instead of the best one.

    Returns:
        ε_lb ≥ 0 (a float); 0 when no threshold gives evidence against ε = 0.

    Example:
        >>> s = np.r_[np.ones(100), np.zeros(100)]; m = np.r_[np.ones(100), np.zeros(100)].astype(bool)
        >>> round(epsilon_lower_bound(s, m), 3)   # log(0.025^(1/100) / (1 − 0.025^(1/100)))
        3.281
    """
    return float(epsilon_lower_bounds(scores, membership, delta=delta, confidence=confidence, method=method,
                                      two_sided=two_sided, threshold=threshold).max())


def perfect_separation_bound(n: int, confidence: float = 0.95) -> float:
    """The largest Clopper–Pearson ε lower bound ``n`` members and ``n`` non-members can give (perfect attack):
    log(c / (1 − c)) with c = (α/2)^(1/n). Tells how much evidence an audit of this size can carry at most."""
    c = ((1 - confidence) / 2) ** (1 / n)
    return math.log(c / (1 - c))
