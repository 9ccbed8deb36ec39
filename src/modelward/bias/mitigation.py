"""Mitigations of feature-wise bias amplification (seed 002 §9.3, digest §2.14), for linear models and for the
linear head of a deep net sliced at its penultimate layer (features z = h(x), see :func:`~.learners.linear_head`).

For a linear g, a feature's influence is its weight (Axiom 4.1), so its *orientation* is the sign of its weight
and its *strength* the weight's magnitude. Removing a feature = zeroing its outgoing weight.

- :func:`feature_parity` — remove the least influential features of the class with more features until both
  classes have as many; the intercept is adjusted by the removed features' mean contribution. The thesis says
  "subtract" (b ← b − Σ w_j·mean_j); keeping the mean logit unchanged would be "add". The sign is a flag
  (``bias_adjust``), default the literal "subtract", which reproduces Table 9.6's synthetic row (digest §8).
- :func:`experts` — keep the α most positive and β most negative features; (α, β) minimise the |bias| on the
  *training* data subject to not lowering training accuracy (all features is always feasible).
- ℓ1 regularisation is a training-time mitigation: :func:`~.learners.fit_sgd` with ``penalty="l1"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from modelward.bias.amplification import LinearModel
from modelward.errors import ConfigError

BiasAdjust = Literal["subtract", "add", "none"]


@dataclass(frozen=True)
class Mitigated:
    """The mitigated model and what was kept."""

    model: LinearModel
    kept: np.ndarray  # boolean mask over features
    info: dict


def _adjust(b: float, w: np.ndarray, removed: np.ndarray, means: np.ndarray | None, how: BiasAdjust) -> float:
    if how == "none" or not removed.any():
        return b
    if means is None:
        raise ConfigError("bias adjustment needs the features' (training) means; pass feature_means or "
                          "bias_adjust='none'")
    delta = float(np.sum(w[removed] * means[removed]))
    if how == "subtract":
        return b - delta
    if how == "add":
        return b + delta
    raise ConfigError(f"bias_adjust={how!r}: valid choices: 'subtract', 'add', 'none'")


def feature_parity(model: LinearModel, feature_means: np.ndarray | None = None,
                   bias_adjust: BiasAdjust = "subtract") -> Mitigated:
    """Feature parity (§9.3 "par"): equalise the number of features oriented towards each class.

    Args:
        model: the linear classifier (or a deep net's linear head).
        feature_means: per-feature training means, for the intercept adjustment.
        bias_adjust: "subtract" (the thesis's wording), "add" (keeps the mean logit) or "none".
    Returns:
        :class:`Mitigated` with the weights of the removed features set to 0.
    Example:
        >>> feature_parity(LinearModel(np.array([3., 1., .5, -2.]), 0.), np.zeros(4)).kept
        array([ True, False, False,  True])
    """
    w = np.asarray(model.w, dtype=float)
    pos, neg = np.flatnonzero(w > 0), np.flatnonzero(w < 0)
    kept = w != 0
    more, fewer = (pos, neg) if len(pos) > len(neg) else (neg, pos)
    excess = len(more) - len(fewer)
    if excess > 0:
        weakest = more[np.argsort(np.abs(w[more]), kind="stable")[:excess]]
        kept[weakest] = False
    removed = (w != 0) & ~kept
    new_w = np.where(kept, w, 0.0)
    b = _adjust(model.b, w, removed, None if feature_means is None else np.asarray(feature_means), bias_adjust)
    return Mitigated(LinearModel(new_w, b), kept,
                     {"removed": int(removed.sum()), "positive": len(pos), "negative": len(neg)})


def _grid(n: int, points: int) -> np.ndarray:
    if n + 1 <= points:
        return np.arange(n + 1)
    g = np.unique(np.round(np.geomspace(1, n, points - 1)).astype(int))
    return np.unique(np.concatenate([[0], g, [n]]))


def experts(model: LinearModel, x_train: np.ndarray, y_train: np.ndarray, feature_means: np.ndarray | None = None,
            bias_adjust: BiasAdjust = "none", grid_points: int = 64) -> Mitigated:
    """Experts (§9.3 "exp"): keep the α most positively and β most negatively influential features.

    (α, β) minimise |B| on the training data subject to training accuracy ≥ that of the unmodified model; ties go
    to higher accuracy, then to more features kept. α and β range over all counts when there are at most
    ``grid_points`` of each sign, else over a geometric grid of ``grid_points`` values (the thesis gives no grid).

    Args:
        model: the linear classifier (or head); x_train, y_train: the training data (features of the head).
        feature_means, bias_adjust: intercept adjustment as in :func:`feature_parity` (default: none).
        grid_points: the largest count of each sign searched exhaustively (else a geometric grid of this size).
    Returns:
        :class:`Mitigated`; ``info`` holds α, β, the training bias and accuracy before and after.
    Example:
        >>> from modelward.bias.amplification import asymmetric_gaussian, bayes_optimal
        >>> s = asymmetric_gaussian(n_weak=10)
        >>> x, y = s.sample(200, np.random.default_rng(0), balanced=True)
        >>> experts(bayes_optimal(s), x, y).kept.shape
        (12,)
    """
    x = np.asarray(x_train, dtype=float)
    y = np.asarray(y_train).astype(np.int64)
    w = np.asarray(model.w, dtype=float)
    if x.ndim != 2 or x.shape[1] != len(w) or len(x) != len(y):
        raise ConfigError(f"experts: x_train {x.shape} must be (N, {len(w)}) with N labels")
    pos = np.flatnonzero(w > 0)
    neg = np.flatnonzero(w < 0)
    pos = pos[np.argsort(-w[pos], kind="stable")]  # most positive first
    neg = neg[np.argsort(w[neg], kind="stable")]  # most negative first
    means = None if feature_means is None else np.asarray(feature_means, dtype=float)
    # cumulative logit contributions: column k = contribution of the k strongest features of that sign
    contrib_p = np.concatenate([np.zeros((len(x), 1)), np.cumsum(x[:, pos] * w[pos], axis=1)], axis=1)
    contrib_n = np.concatenate([np.zeros((len(x), 1)), np.cumsum(x[:, neg] * w[neg], axis=1)], axis=1)
    shift_p = np.zeros(len(pos) + 1)
    shift_n = np.zeros(len(neg) + 1)
    if bias_adjust != "none" and means is not None:
        # intercept change when everything beyond the first k is removed
        tail_p = np.concatenate([np.cumsum((w[pos] * means[pos])[::-1])[::-1], [0.0]])
        tail_n = np.concatenate([np.cumsum((w[neg] * means[neg])[::-1])[::-1], [0.0]])
        sign = -1.0 if bias_adjust == "subtract" else 1.0
        shift_p, shift_n = sign * tail_p, sign * tail_n
    elif bias_adjust != "none":
        raise ConfigError("experts: bias adjustment needs feature_means")
    ga, gb = _grid(len(pos), grid_points), _grid(len(neg), grid_points)
    # count predictions of 1 and correct predictions for every (α, β), in row chunks to bound memory
    n_pos_pred = np.zeros((len(ga), len(gb)))
    n_correct = np.zeros((len(ga), len(gb)))
    offset = (model.b + shift_p[ga])[:, None] + shift_n[gb][None, :]
    for i in range(0, len(x), 1024):
        logit = contrib_p[i : i + 1024, ga][:, :, None] + contrib_n[i : i + 1024, gb][:, None, :] + offset[None]
        pred = logit > 0
        n_pos_pred += pred.sum(0)
        n_correct += (pred == (y[i : i + 1024, None, None] == 1)).sum(0)
    acc = n_correct / len(x)
    bias = n_pos_pred / len(x) - y.mean()
    base_acc, base_bias = acc[-1, -1], bias[-1, -1]
    feasible = acc >= base_acc - 1e-12
    score = np.where(feasible, np.abs(bias), np.inf)
    n_kept = ga[:, None] + gb[None, :]
    # lexicographic: smallest |bias|, then highest accuracy, then most features
    order = np.lexsort((-n_kept.ravel(), -acc.ravel(), score.ravel()))
    i, j = np.unravel_index(order[0], score.shape)
    a, b_ = int(ga[i]), int(gb[j])
    kept = np.zeros(len(w), dtype=bool)
    kept[pos[:a]] = True
    kept[neg[:b_]] = True
    removed = (w != 0) & ~kept
    new_b = _adjust(model.b, w, removed, means, bias_adjust)
    return Mitigated(LinearModel(np.where(kept, w, 0.0), new_b), kept,
                     {"alpha": a, "beta": b_, "n_positive": len(pos), "n_negative": len(neg),
                      "train_bias_before": float(base_bias), "train_bias_after": float(bias[i, j]),
                      "train_acc_before": float(base_acc), "train_acc_after": float(acc[i, j])})
