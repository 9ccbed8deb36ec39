"""Membership-inference metrics (seed 002 §8.3.3, App. C) and the low-FPR view of the field (Carlini et al. 2022).

Thesis metrics on a balanced evaluation set (members = target training points, non-members = test points):
accuracy a, **advantage 2(a − ½)** (= TPR − FPR when balanced), **precision** (PPV) with the rule *no predicted
member ⇒ precision ½*, and calibrated precision at the α-percentile of hold-out scores (App. C, see
:mod:`.membership.calibration`). Beyond the thesis: the ROC curve, its AUC, the TPR at 0.1 % and 1 % FPR, and the empirical ε lower bound
(best Clopper–Pearson bound over thresholds at 95 %, δ = 0; :mod:`.epsilon`) next to them.
All are recomputable from the saved arrays (``scores.npy``, ``members.npy``; ``scores.csv``).
"""

from __future__ import annotations

import csv
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

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
