"""Label leakage from the cut-layer gradient: the norm and direction attacks of Li et al. (2022).

In two-party split learning the non-label party (Alice) receives, for every example of every batch, the gradient
``g_i = dL/dh_i`` of the loss with respect to her own output. Li et al. ("Label Leakage and Protection in Two-party
Split Learning", ICLR 2022) show that it reveals the labels:

- **norm attack**: for a binary softmax / sigmoid head ``g_i = (p_i - y_i) ∇_h z_i``; the rare class is
  predicted with low confidence, so its ``|p_i - y_i|`` and hence ``||g_i||`` is larger. Score: ``||g_i||₂``,
  the minority class taken as positive.
- **direction attack**: examples of the same class get gradients pointing the same way (cosine > 0), of
  different classes opposite ways. Knowing one positive example's gradient in the batch, score every other
  example by its cosine with it.

Multiclass (our extension, as the paper treats binary labels): the direction attack scores class c by the cosine
with one known example of class c in the batch, one-vs-rest, and the label is recovered as the class of the most
similar reference (``direction_accuracy``); ``pairwise_auc`` needs no label at all (does a same-class pair have a
higher cosine than a different-class pair?). The norm attack is reported one-vs-rest per class (macro mean).

Leakage is the AUC of these scores against the true labels, per batch, averaged over training steps: 0.5 = the
gradient tells nothing, 1.0 = labels fully recovered.

Example:
    >>> batch_leakage(g_received, y_true, positive=0)  # doctest: +SKIP
    {'norm_auc': 0.93, 'direction_auc': 1.0, ...}
"""

from __future__ import annotations

import numpy as np
import torch

from modelward.governance.party.label_protection import LabelProtectionConfig, protect_gradient

__all__ = ["LabelProtectionConfig", "auc", "batch_leakage", "cosine_scores", "norm_scores", "pairwise_auc",
           "protect_gradient", "LeakageMeter"]


def auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """Area under the ROC curve = P(score of a random positive > score of a random negative), ties count 1/2
    (the Mann-Whitney U statistic). NaN when either class is absent."""
    from scipy.stats import rankdata

    scores = np.asarray(scores, dtype=np.float64)
    positive = np.asarray(positive, dtype=bool)
    n_pos = int(positive.sum())
    n_neg = len(positive) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(scores)
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def norm_scores(grad: torch.Tensor) -> np.ndarray:
    """Norm attack score per example: ``||g_i||₂`` (Li et al. 2022, norm scoring)."""
    return grad.detach().reshape(grad.shape[0], -1).double().norm(dim=1).cpu().numpy()


def cosine_scores(grad: torch.Tensor, reference: torch.Tensor) -> np.ndarray:
    """Direction attack score per example: cosine between ``g_i`` and a known example's gradient (Li et al. 2022)."""
    g = grad.detach().reshape(grad.shape[0], -1).double()
    r = reference.detach().reshape(-1).double()
    return torch.nn.functional.cosine_similarity(g, r[None, :], dim=1, eps=1e-30).cpu().numpy()


def pairwise_auc(grad: torch.Tensor, labels: torch.Tensor) -> float:
    """Label-free direction leakage: AUC of the cosine of a pair for "same label" over all pairs in the batch."""
    g = torch.nn.functional.normalize(grad.detach().reshape(grad.shape[0], -1).double(), dim=1, eps=1e-30)
    cos = (g @ g.T).cpu().numpy()
    y = labels.cpu().numpy()
    iu = np.triu_indices(len(y), 1)
    return auc(cos[iu], (y[:, None] == y[None, :])[iu])


def batch_leakage(grad: torch.Tensor, labels: torch.Tensor, num_classes: int, positive: int = 1,
                  rng: np.random.Generator | None = None, scores_out: dict | None = None) -> dict[str, float]:
    """All attacks on one batch of received gradients.

    Args:
        grad: what Alice received, ``[B, ...]``.
        labels: the true labels (for scoring the attacks only; Alice does not have them).
        num_classes: number of classes; 2 = binary (Li et al.'s setting).
        positive: binary only: the class the attacker calls positive (the minority class, from the prior).
        rng: chooses the known reference example(s) in the batch.
        scores_out: if given, receives ``"direction"`` (``[B, K]`` cosines with each class's reference, NaN where
            the batch has no reference of that class; binary: K = 1, the positive reference) and ``"keep"`` (the
            examples that are not references), for attacks that accumulate over epochs.
    Returns:
        ``norm_auc``, ``direction_auc`` (binary: cosine with one known positive; multiclass: macro one-vs-rest
        with one known example per class), ``pairwise_auc`` and, multiclass only, ``direction_accuracy`` and
        ``norm_auc_c<k>`` / ``direction_auc_c<k>`` per class. NaN where the batch lacks a needed class.
    """
    rng = rng if rng is not None else np.random.default_rng(0)
    y = labels.detach().cpu().numpy().astype(np.int64)
    norms = norm_scores(grad)
    out: dict[str, float] = {"pairwise_auc": pairwise_auc(grad, labels)}
    ref_classes = [positive] if num_classes == 2 else list(range(num_classes))
    refs: dict[int, int] = {}
    for c in ref_classes:
        idx = np.flatnonzero(y == c)
        if len(idx):
            refs[c] = int(rng.choice(idx))
    keep = np.ones(len(y), dtype=bool)
    keep[list(refs.values())] = False
    sims = {c: cosine_scores(grad, grad[r]) for c, r in refs.items()}
    if scores_out is not None:
        nan = np.full(len(y), np.nan)
        scores_out["direction"] = np.stack([sims.get(c, nan) for c in ref_classes], axis=1)
        scores_out["keep"] = keep
    if num_classes == 2:
        out["norm_auc"] = auc(norms, y == positive)
        out["direction_auc"] = auc(sims[positive][keep], (y == positive)[keep]) if positive in sims else float("nan")
        return out
    norm_aucs, dir_aucs = [], []
    for c in range(num_classes):
        n_auc = auc(norms, y == c)
        d_auc = auc(sims[c][keep], (y == c)[keep]) if c in sims else float("nan")
        out[f"norm_auc_c{c}"], out[f"direction_auc_c{c}"] = n_auc, d_auc
        norm_aucs.append(n_auc)
        dir_aucs.append(d_auc)
    out["norm_auc"] = _nanmean(norm_aucs)
    out["direction_auc"] = _nanmean(dir_aucs)
    if sims and keep.any():
        classes = np.array(list(sims))
        guess = classes[np.stack([sims[c] for c in classes]).argmax(0)]
        out["direction_accuracy"] = float((guess[keep] == y[keep]).mean())
    return out


def _nanmean(vals: list[float] | np.ndarray) -> float:
    a = np.asarray(vals, dtype=np.float64)
    return float(np.nanmean(a)) if len(a) and not np.isnan(a).all() else float("nan")


class LeakageMeter:
    """Accumulates :func:`batch_leakage` over training steps.

    ``summary()`` gives the mean of each per-batch metric over steps and, when example indices are passed to
    ``update``, the *accumulated* direction attack (our extension of Li et al.): Alice sees every training example
    once per epoch, so she averages each example's cosine scores over all the epochs it appeared in; fresh noise per
    step averages out, which makes this the stronger attack against a noise defence (``direction_auc_acc``,
    multiclass also ``direction_accuracy_acc``).
    """

    def __init__(self, num_classes: int, positive: int = 1, seed: int = 0) -> None:
        self.num_classes = num_classes
        self.positive = positive
        self.rng = np.random.default_rng(seed)
        self.rows: list[dict[str, float]] = []
        k = 1 if num_classes == 2 else num_classes
        self._sum: dict[int, np.ndarray] = {}
        self._n: dict[int, np.ndarray] = {}
        self._label: dict[int, int] = {}
        self._k = k

    def update(self, grad: torch.Tensor, labels: torch.Tensor, step: int | None = None,
               index: torch.Tensor | None = None) -> dict[str, float]:
        """Score one batch; `index` = the examples' indices in the training set (Alice knows them)."""
        scores: dict = {}
        row = batch_leakage(grad, labels, self.num_classes, self.positive, self.rng, scores)
        if step is not None:
            row["step"] = step
        self.rows.append(row)
        if index is not None:
            y = labels.detach().cpu().numpy()
            for j, i in enumerate(index.tolist()):
                if not scores["keep"][j]:
                    continue
                s = scores["direction"][j]
                ok = ~np.isnan(s)
                self._sum.setdefault(i, np.zeros(self._k))[ok] += s[ok]
                self._n.setdefault(i, np.zeros(self._k))[ok] += 1
                self._label[i] = int(y[j])
        return row

    def accumulated(self) -> dict[str, float]:
        """AUC (and multiclass accuracy) of the per-example mean direction scores over all steps so far."""
        if not self._sum:
            return {}
        ids = sorted(self._sum)
        mean = np.stack([self._sum[i] / np.maximum(self._n[i], 1) for i in ids])
        seen = np.stack([self._n[i] > 0 for i in ids])
        y = np.array([self._label[i] for i in ids])
        if self.num_classes == 2:
            ok = seen[:, 0]
            return {"direction_auc_acc": auc(mean[ok, 0], y[ok] == self.positive)}
        aucs = [auc(mean[seen[:, c], c], y[seen[:, c]] == c) for c in range(self.num_classes)]
        guess = np.where(seen, mean, -np.inf).argmax(1)
        return {"direction_auc_acc": _nanmean(aucs), "direction_accuracy_acc": float((guess == y).mean())}

    def summary(self, keys: tuple[str, ...] = ("norm_auc", "direction_auc", "pairwise_auc", "direction_accuracy")
                ) -> dict[str, float]:
        out = {}
        for k in keys:
            vals = [r[k] for r in self.rows if k in r]
            if vals:
                out[k] = _nanmean(vals)
        return {**out, **self.accumulated()}
