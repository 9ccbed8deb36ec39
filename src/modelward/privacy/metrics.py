"""Membership-inference metrics (seed 002 §8.3.3, App. C) and the low-FPR view of the field (Carlini et al. 2022).

Thesis metrics on a balanced evaluation set (members = target training points, non-members = test points):
accuracy a, **advantage 2(a − ½)** (= TPR − FPR when balanced), **precision** (PPV) with the rule *no predicted
member ⇒ precision ½*, and calibrated precision at the α-percentile of hold-out scores (App. C, see
:mod:`.membership.calibration`). Beyond the thesis: the ROC curve, its AUC, the TPR at 0.1 % and 1 % FPR, and the empirical ε lower bound
(best Clopper–Pearson bound over thresholds at 95 %, δ = 0; :mod:`.epsilon`) next to them.
All are recomputable from the saved arrays (``scores.npy``, ``members.npy``; ``scores.csv``).

Confidence intervals that carry every source of sampling noise (issue 38): :func:`tpr_at_fpr_interval` (a TPR at a
low FPR depends on the members *and* on the non-members that set its threshold), :func:`auc_interval` (DeLong),
:func:`advantage_interval` (TPR − FPR at a fixed threshold, Newcombe). :func:`membership_figures` gathers them.
"""

from __future__ import annotations

import csv
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from scipy.special import betainc, betaincinv

from modelward.core.stats import Z95, newcombe
from modelward.errors import DataError
from modelward.privacy.epsilon import check_scores, epsilon_lower_bound

_check = check_scores  # the shared input check (modelward.privacy.epsilon)


def roc_curve(scores: np.ndarray, members: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fpr, tpr, thresholds): predict member iff score ≥ threshold; ties move together (no optimistic order).

    Args:
        scores: per-example attack scores (higher = member).
        members: the true membership (bool), same length.

    Returns:
        ``(fpr, tpr, thresholds)`` arrays, starting at ``(0, 0, inf)``, one point per distinct score.

    Example:
        >>> fpr, tpr, thr = roc_curve(np.array([0.9, 0.2]), np.array([True, False]))
        >>> fpr.tolist(), tpr.tolist()
        ([0.0, 0.0, 1.0], [0.0, 1.0, 1.0])
    """
    s, m = _check(scores, members)
    order = np.argsort(-s, kind="mergesort")
    s, m = s[order], m[order]
    distinct = np.r_[np.nonzero(np.diff(s))[0], len(s) - 1]
    tp = np.cumsum(m)[distinct]
    fp = np.cumsum(~m)[distinct]
    P, N = max(int(m.sum()), 1), max(int((~m).sum()), 1)
    tpr = np.r_[0.0, tp / P]
    fpr = np.r_[0.0, fp / N]
    thr = np.r_[np.inf, s[distinct]]
    return fpr, tpr, thr


def auc(fpr: np.ndarray, tpr: np.ndarray) -> float:
    return float(np.trapezoid(tpr, fpr))


def tpr_at_fpr(fpr: np.ndarray, tpr: np.ndarray, max_fpr: float) -> float:
    """Largest TPR among operating points with FPR ≤ ``max_fpr`` (0 if even the strictest point exceeds it)."""
    ok = fpr <= max_fpr + 1e-12
    return float(tpr[ok].max()) if ok.any() else 0.0


def _cp_lower(k: int, n: int, a: float) -> float:
    """One-sided Clopper–Pearson lower bound at level 1 − a (0 for k = 0)."""
    return 0.0 if k <= 0 else float(betaincinv(k, n - k + 1, a))


def _cp_upper(k: int, n: int, a: float) -> float:
    """One-sided Clopper–Pearson upper bound at level 1 − a (1 for k = n)."""
    return 1.0 if k >= n else float(betaincinv(k + 1, n - k, 1.0 - a))


def tpr_at_fpr_interval(scores: np.ndarray, members: np.ndarray, max_fpr: float = 0.01,
                        confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval of the TPR at a false-positive rate `max_fpr`, with the threshold's own
    uncertainty (issue 38).

    The TPR at 1 % FPR is read at a threshold set by the non-members: with 250 of them it rests on the 2–3 highest
    non-member scores, and its true FPR is itself a random variable. Both sources are bounded exactly:

    - *threshold*: the j-th highest of N non-member scores, v_(j), has a true exceedance probability
      P(S > v_(j)) distributed as Beta(j, N − j + 1) for continuous scores (order statistics; with ties it is
      stochastically smaller, P(S ≥ v_(j)) larger, which is the safe side for each bound below). The lower bound
      uses the lowest v_(j) whose true FPR is ≤ `max_fpr` with probability ≥ 1 − α/4, the upper bound the highest
      v_(j) whose true FPR is ≥ `max_fpr` with probability ≥ 1 − α/4 (TPR is monotone in the threshold);
    - *members*: the members above that threshold are Binomial(n, TPR(τ)) given τ (members and non-members are
      independent samples): one-sided Clopper–Pearson bounds at α/4.

    By the union bound the interval covers the true TPR at `max_fpr` with probability ≥ `confidence` (conservative).
    With too few non-members to certify any threshold below `max_fpr` the lower bound is 0: 250 non-members cannot
    pin a 1 % FPR to 97.5 % confidence, and the interval says so instead of resting on 2.5 points.

    Args:
        scores: attack scores (higher = member); members: boolean truth.
        max_fpr: the FPR of interest (0.01 for "TPR at 1 % FPR").
        confidence: the two-sided confidence level.

    Returns:
        ``(lower, upper)``.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> s, m = rng.random(500), np.r_[np.ones(250, bool), np.zeros(250, bool)]   # a chance-level attack
        >>> lo, hi = tpr_at_fpr_interval(s, m)
        >>> lo <= 0.01 <= hi
        True
    """
    s, m = _check(scores, members)
    mem, non = s[m], np.sort(s[~m])[::-1]  # non-members, highest first: non[j - 1] = v_(j)
    n, big_n = len(mem), len(non)
    if n == 0 or big_n == 0:
        raise DataError(f"need both members and non-members (got {n} members, {big_n} non-members)")
    a = (1.0 - confidence) / 4.0
    j = np.arange(1, big_n + 1)
    p_below = betainc(j, big_n - j + 1, max_fpr)  # P(Beta(j, N − j + 1) ≤ max_fpr), decreasing in j
    ok_lo = np.flatnonzero(p_below >= 1.0 - a)
    if len(ok_lo):
        tau = non[ok_lo[-1]]
        lower = _cp_lower(int((mem > tau).sum()), n, a)
    else:
        lower = 0.0
    ok_hi = np.flatnonzero(1.0 - p_below >= 1.0 - a)
    if len(ok_hi):
        tau = non[ok_hi[0]]
        upper = _cp_upper(int((mem >= tau).sum()), n, a)
    else:
        upper = 1.0
    est = tpr_at_fpr(*roc_curve(s, m)[:2], max_fpr)
    return min(lower, est), max(upper, est)


def auc_interval(scores: np.ndarray, members: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """DeLong's interval of the ROC AUC (DeLong, DeLong & Clarke-Pearson 1988): the variance from the members' and
    the non-members' placement values (ties count ½), a normal interval clipped to [0, 1].

    Args:
        scores: attack scores (higher = member); members: boolean truth; confidence: two-sided level.

    Returns:
        ``(lower, upper)``.

    Example:
        >>> lo, hi = auc_interval(np.array([0.9, 0.8, 0.3, 0.1]), np.array([True, False, True, False]))
        >>> lo < 0.75 < hi
        True
    """
    s, m = _check(scores, members)
    mem, non = s[m], np.sort(s[~m])
    n, big_n = len(mem), len(non)
    if n < 2 or big_n < 2:
        return (0.0, 1.0)
    below = np.searchsorted(non, mem, "left")
    ties = np.searchsorted(non, mem, "right") - below
    v10 = (below + 0.5 * ties) / big_n  # per member: share of non-members it outscores
    mem_sorted = np.sort(mem)
    above = n - np.searchsorted(mem_sorted, non, "right")
    ties01 = np.searchsorted(mem_sorted, non, "right") - np.searchsorted(mem_sorted, non, "left")
    v01 = (above + 0.5 * ties01) / n  # per non-member: share of members that outscore it
    est = float(v10.mean())
    se = float(np.sqrt(v10.var(ddof=1) / n + v01.var(ddof=1) / big_n))
    from scipy.stats import norm

    z = float(norm.ppf(0.5 + confidence / 2)) if confidence != 0.95 else Z95
    return max(0.0, est - z * se), min(1.0, est + z * se)


def advantage_interval(tp: int, n_members: int, fp: int, n_nonmembers: int) -> tuple[float, float]:
    """95 % interval of the advantage TPR − FPR at a *fixed* threshold (set before looking at these points):
    Newcombe's hybrid score interval of the difference of the two independent proportions."""
    return newcombe(fp, n_nonmembers, tp, n_members)


@dataclass(frozen=True)
class MembershipFigures:
    """The figures a membership verdict rests on, each with its 95 % interval and its chance value.

    Attributes:
        tpr_at_1pct_fpr, tpr_at_1pct_fpr_ci: TPR at 1 % FPR (chance: 0.01) and :func:`tpr_at_fpr_interval`.
        tpr_at_0_1pct_fpr, tpr_at_0_1pct_fpr_ci: the same at 0.1 % FPR (chance: 0.001).
        auc, auc_ci: ROC AUC (chance: 0.5) and :func:`auc_interval`.
        advantage, advantage_ci: TPR − FPR at the attack's own threshold (chance: 0), :func:`advantage_interval`.
        n_members, n_nonmembers: the evidence.
    """

    tpr_at_1pct_fpr: float
    tpr_at_1pct_fpr_ci: tuple[float, float]
    tpr_at_0_1pct_fpr: float
    tpr_at_0_1pct_fpr_ci: tuple[float, float]
    auc: float
    auc_ci: tuple[float, float]
    advantage: float
    advantage_ci: tuple[float, float]
    n_members: int
    n_nonmembers: int

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def membership_figures(scores: np.ndarray, members: np.ndarray, threshold: float) -> MembershipFigures:
    """Every figure of :class:`MembershipFigures` for one attack's scores (member iff score > `threshold`).

    Example:
        >>> f = membership_figures(np.array([0.9, 0.8, 0.3, 0.1]), np.array([True, False, True, False]), 0.5)
        >>> f.auc, f.advantage
        (0.75, 0.0)
    """
    s, m = _check(scores, members)
    fpr, tpr, _ = roc_curve(s, m)
    d = s > threshold
    tp, fp, n, big_n = int((d & m).sum()), int((d & ~m).sum()), int(m.sum()), int((~m).sum())
    return MembershipFigures(
        tpr_at_1pct_fpr=tpr_at_fpr(fpr, tpr, 0.01), tpr_at_1pct_fpr_ci=tpr_at_fpr_interval(s, m, 0.01),
        tpr_at_0_1pct_fpr=tpr_at_fpr(fpr, tpr, 0.001), tpr_at_0_1pct_fpr_ci=tpr_at_fpr_interval(s, m, 0.001),
        auc=auc(fpr, tpr), auc_ci=auc_interval(s, m), advantage=tp / n - fp / big_n,
        advantage_ci=advantage_interval(tp, n, fp, big_n), n_members=n, n_nonmembers=big_n)


@dataclass(frozen=True)
class MembershipMetrics:
    """Thesis metrics at the attack's decision threshold plus ROC summaries. ``n_*`` say how much evidence."""

    accuracy: float
    advantage: float
    precision: float
    recall: float
    tpr: float
    fpr: float
    auc: float
    tpr_at_0_1pct_fpr: float
    tpr_at_1pct_fpr: float
    n_members: int
    n_nonmembers: int
    n_predicted_members: int
    # best Clopper–Pearson ε lower bound over thresholds at 95 %, δ = 0 (modelward.privacy.epsilon)
    epsilon_lb: float = float("nan")

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def precision(decisions: np.ndarray, members: np.ndarray) -> float:
    """PPV with the thesis rule: if no point is predicted a member, precision := ½ (§8.3.3)."""
    d = np.asarray(decisions).astype(bool)
    m = np.asarray(members).astype(bool)
    return 0.5 if d.sum() == 0 else float((d & m).sum() / d.sum())


def evaluate(scores: np.ndarray, members: np.ndarray, threshold: float,
             decisions: np.ndarray | None = None) -> MembershipMetrics:
    """All metrics for per-example ``scores`` (higher = member) against the true membership.

    Args:
        scores: attack scores; members: boolean truth; threshold: decision threshold (member iff score > t).
        decisions: explicit decisions (default ``scores > threshold``).
    Returns:
        :class:`MembershipMetrics`. accuracy is the *balanced* accuracy (mean of TPR and TNR), equal to plain
        accuracy on the thesis' balanced sets, so advantage = 2(a − ½) = TPR − FPR always holds.
    Example:
        >>> evaluate(np.array([0.9, 0.2]), np.array([True, False]), 0.5).advantage
        1.0
    """
    s, m = _check(scores, members)
    d = s > threshold if decisions is None else np.asarray(decisions).astype(bool).reshape(-1)
    P, N = int(m.sum()), int((~m).sum())
    if P == 0 or N == 0:
        raise DataError(f"need both members and non-members to evaluate (got {P} members, {N} non-members)")
    tpr = float((d & m).sum() / P)
    fpr = float((d & ~m).sum() / N)
    acc = 0.5 * (tpr + 1.0 - fpr)
    f, t, _ = roc_curve(s, m)
    return MembershipMetrics(
        accuracy=acc, advantage=2 * (acc - 0.5), precision=precision(d, m), recall=tpr, tpr=tpr, fpr=fpr,
        auc=auc(f, t), tpr_at_0_1pct_fpr=tpr_at_fpr(f, t, 0.001), tpr_at_1pct_fpr=tpr_at_fpr(f, t, 0.01),
        n_members=P, n_nonmembers=N, n_predicted_members=int(d.sum()),
        epsilon_lb=epsilon_lower_bound(s, m),
    )


def save_scores(out_dir: str | Path, name: str, scores: np.ndarray, members: np.ndarray,
                decisions: np.ndarray | None = None, threshold: float | None = None) -> dict[str, Path]:
    """Write ``<name>.scores.npy``, ``<name>.members.npy`` and ``<name>.scores.csv`` (index, score, member,
    decision) so any external tool can recompute every metric."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    s, m = _check(scores, members)
    d = (s > threshold if threshold is not None else np.zeros_like(m)) if decisions is None else decisions
    paths = {"scores": out / f"{name}.scores.npy", "members": out / f"{name}.members.npy",
             "csv": out / f"{name}.scores.csv"}
    for key, arr in (("scores", s), ("members", m)):
        tmp = paths[key].with_suffix(".tmp.npy")
        np.save(tmp, arr)
        tmp.replace(paths[key])
    tmp = paths["csv"].with_suffix(".tmp")
    with tmp.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["index", "score", "member", "decision"])
        for i, (a, b, c) in enumerate(zip(s, m, np.asarray(d).astype(bool), strict=True)):
            w.writerow([i, repr(float(a)), int(b), int(c)])
    tmp.replace(paths["csv"])
    return paths


def dp_advantage_bounds(epsilon: float, delta: float = 0.0) -> dict[str, float]:
    """Upper bounds on membership advantage implied by (ε, δ)-DP.

    * ``yeom``: e^ε − 1 (Yeom et al. 2018, pure ε; the bound App. C uses; 64.2 % max accuracy at ε = 0.25);
    * ``hypothesis_test``: (1 − δ)(e^ε − 1)/(e^ε + 1) + δ — the tight (ε, δ) form from the hypothesis-testing view
      of DP (Kairouz et al. 2015): TPR ≤ e^ε FPR + δ and 1 − FPR ≤ e^ε (1 − TPR) + δ, maximised over TPR − FPR.
    Both are capped at 1. Returns the bounds and the matching maximal balanced accuracies.
    """
    e = float(np.exp(epsilon))
    yeom = min(1.0, e - 1.0)
    ht = min(1.0, (1.0 - delta) * (e - 1.0) / (e + 1.0) + delta)
    return {"yeom": yeom, "hypothesis_test": ht, "max_accuracy_yeom": 0.5 + yeom / 2,
            "max_accuracy_hypothesis_test": 0.5 + ht / 2}
