"""Per-slice and per-record membership risk from an attack's (scores, membership) arrays.

* **Slices** (as TF Privacy's ``membership_inference_attack`` slicing: per class, and correctly / incorrectly
  classified by the target): for each slice its members and non-members, AUC, TPR at 1 % FPR (the slice's own
  non-members set the threshold) and the Clopper–Pearson ε lower bound (:mod:`.epsilon`). The **worst slice** is
  the one with the largest TPR at 1 % FPR (ties: larger AUC) among slices with at least ``min_slice`` members and
  non-members; smaller slices are listed but flagged, their figures too noisy to rank.
* **Records** (ML Privacy Meter's per-record view): a member's exposure is the fraction of non-members that score
  at least as high, p̂ = #{non-members with score ≥ s} / N — the lowest FPR at which a threshold flags this record.
  Its 95 % Clopper–Pearson interval is [Beta⁻¹(α/2; k, N − k + 1), Beta⁻¹(1 − α/2; k + 1, N − k)]. The most
  exposed records are the members with the smallest p̂ (ties: the higher score).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats

from modelward.errors import DataError
from modelward.privacy import metrics
from modelward.privacy.epsilon import epsilon_lower_bound


def _slice_row(name: str, s: np.ndarray, m: np.ndarray, min_slice: int) -> dict[str, Any]:
    P, N = int(m.sum()), int((~m).sum())
    row: dict[str, Any] = {"slice": name, "n_members": P, "n_nonmembers": N, "auc": float("nan"),
                           "tpr_at_1pct_fpr": float("nan"), "epsilon_lb": float("nan"),
                           "ranked": bool(P >= min_slice and N >= min_slice)}
    if P and N:
        fpr, tpr, _ = metrics.roc_curve(s, m)
        row |= {"auc": metrics.auc(fpr, tpr), "tpr_at_1pct_fpr": metrics.tpr_at_fpr(fpr, tpr, 0.01),
                "epsilon_lb": epsilon_lower_bound(s, m)}
    return row


def slice_risk(scores: np.ndarray, members: np.ndarray, labels: np.ndarray, correct: np.ndarray, *,
               min_slice: int = 20) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Risk per slice (all, class=c, correctly / incorrectly classified) and the worst ranked slice.

    Args:
        scores: attack scores (higher = member); members: the truth; labels: each point's true class;
        correct: whether the target classifies the point correctly; min_slice: the fewest members and
        non-members a slice needs to be ranked.

    Returns:
        (rows, worst): one dict per slice (slice, n_members, n_nonmembers, auc, tpr_at_1pct_fpr, epsilon_lb,
        ranked) and the worst ranked slice's row (None if no slice is large enough).

    Example:
        >>> rows, worst = slice_risk(np.r_[1.0, 0.0, 1.0, 0.0], np.r_[1, 0, 1, 0].astype(bool),
        ...                          np.r_[0, 0, 1, 1], np.ones(4, bool), min_slice=1)
        >>> [r["slice"] for r in rows], worst["slice"]
        (['all', 'class=0', 'class=1', 'correct'], 'class=0')
    """
    s, m = metrics._check(scores, members)
    lab = np.asarray(labels).reshape(-1)
    cor = np.asarray(correct).astype(bool).reshape(-1)
    if len(lab) != len(s) or len(cor) != len(s):
        raise DataError(f"slice_risk: {len(s)} scores but {len(lab)} labels and {len(cor)} correctness flags")
    parts = [("all", np.ones(len(s), bool))]
    parts += [(f"class={c}", lab == c) for c in np.unique(lab)]
    parts += [("correct", cor), ("misclassified", ~cor)]
    rows = [_slice_row(name, s[sel], m[sel], min_slice) for name, sel in parts if sel.any()]
    ranked = [r for r in rows if r["ranked"] and r["slice"] != "all"]
    worst = max(ranked, key=lambda r: (r["tpr_at_1pct_fpr"], r["auc"]), default=None)
    return rows, worst


def exposed_records(scores: np.ndarray, members: np.ndarray, *, top: int = 20, confidence: float = 0.95,
                    record_ids: np.ndarray | None = None) -> list[dict[str, Any]]:
    """The ``top`` most exposed members: the FPR at which each is flagged, with its Clopper–Pearson interval.

    Args:
        scores / members: the attack's arrays; top: how many records; confidence: of the interval;
        record_ids: each point's id in the user's data (default: its position in ``scores``).

    Returns:
        dicts (rank, record, score, exposure_fpr, fpr_low, fpr_high, nonmembers_at_or_above, n_nonmembers).

    Example:
        >>> recs = exposed_records(np.r_[5.0, 1.0, 0.0], np.r_[1, 1, 0].astype(bool), top=1)
        >>> recs[0]["record"], recs[0]["exposure_fpr"]
        (0, 0.0)
    """
    s, m = metrics._check(scores, members)
    ids = np.arange(len(s)) if record_ids is None else np.asarray(record_ids).reshape(-1)
    if len(ids) != len(s):
        raise DataError(f"exposed_records: {len(s)} scores but {len(ids)} record ids")
    out = np.sort(s[~m])
    N = len(out)
    if N == 0 or not m.any():
        raise DataError("exposed_records needs members and non-members")
    alpha = 1 - confidence
    mem = np.nonzero(m)[0]
    k = N - np.searchsorted(out, s[mem], side="left")  # non-members scoring ≥ the record
    order = np.lexsort((-s[mem], k))[:top]
    rows = []
    for rank, j in enumerate(order, 1):
        kj = int(k[j])
        lo = 0.0 if kj == 0 else float(stats.beta.ppf(alpha / 2, kj, N - kj + 1))
        hi = 1.0 if kj == N else float(stats.beta.ppf(1 - alpha / 2, kj + 1, N - kj))
        rows.append({"rank": rank, "record": int(ids[mem[j]]), "score": float(s[mem[j]]), "exposure_fpr": kj / N,
                     "fpr_low": lo, "fpr_high": hi, "nonmembers_at_or_above": kj, "n_nonmembers": N})
    return rows
