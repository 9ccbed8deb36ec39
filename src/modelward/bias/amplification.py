"""Bias amplification in binary classifiers (seed 002 Ch. 9, Sec. 9.1–9.2).

- :func:`bias_amplification` — B_D(F) = E[F(x) − y] = Pr[F(x) = 1] − p* (Def. 9.1–9.2), class 1 the majority.
- :func:`theorem_9_1` — the closed form for the Bayes-optimal predictor of the Gaussian setting (Eq. 9.1), with
  the *corrected* sign β = −D⁻¹ log(p*/(1 − p*)) (the printed Eq. 9.8 has it backwards; digest §0).
- :class:`GaussianSetting` / :func:`bayes_optimal` — Eq. 9.1–9.2 with the corrected intercept
  b = −½(μ1 + μ0)ᵀw + log(p*/(1 − p*)) (the printed Eq. 9.2 has a minus between the means).
- :func:`asymmetric_gaussian` — the synthetic generator of Eq. 9.11 with the weak-feature *variance* an explicit,
  named parameter (``weak_var``; the thesis writes σ_w for what Sec. 9.3 calls σ_w², digest §0).
- :func:`asymmetry` — the fraction of features oriented towards y = 1, from class-mean differences (Table 9.6).
- :func:`weak_weight_error` — (1/n) Σ (ŵ_{i+2} − w_{i+2}), Fig. 9.3c's signed error of the weak weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

from modelward.errors import ConfigError, DataError


def bias_amplification(pred: np.ndarray, y: np.ndarray) -> float:
    """B_D(F) = mean(F(x)) − mean(y) over a sample of D (Def. 9.1), labels in {0, 1} with 1 the majority class.

    Args:
        pred: predicted labels F(x) ∈ {0, 1}.
        y: true labels ∈ {0, 1}.
    Returns:
        Pr[F(x) = 1] − p*, positive when the model predicts the majority class in excess of its prior.
    Example:
        >>> bias_amplification(np.array([1, 1, 1, 0]), np.array([1, 1, 0, 0]))
        0.25
    """
    pred, y = np.asarray(pred).ravel(), np.asarray(y).ravel()
    if pred.shape != y.shape or len(y) == 0:
        raise DataError(f"bias_amplification: predictions {pred.shape} and labels {y.shape} must be equal, non-empty")
    for name, a in (("predictions", pred), ("labels", y)):
        if not np.isin(a, (0, 1)).all():
            raise DataError(f"bias_amplification: {name} must be binary 0/1 (got values {np.unique(a)[:5]})")
    return float(pred.mean() - y.mean())


def theorem_9_1(p: float, distance: float) -> float:
    """B_D(h*) of the Bayes-optimal predictor when x | y ∼ N(μ_y, Σ) (Theorem 9.1, corrected sign).

    B = 1 − p − (1 − p)·Φ(β + D/2) − p·Φ(β − D/2),  β = −log(p/(1 − p)) / D,  D = Mahalanobis distance.

    Args:
        p: the majority-class prior p* ∈ [1/2, 1).
        distance: D > 0.
    Returns:
        the expected bias amplification; 0 at p = 1/2 (Corollary 9.2), → 1 − p as D → 0.
    Example:
        >>> round(theorem_9_1(0.75, 0.5), 4)
        0.2382
    """
    if not 0.0 < p < 1.0:
        raise ConfigError(f"theorem_9_1: p must be in (0, 1), got {p}")
    if distance <= 0:
        raise ConfigError(f"theorem_9_1: the Mahalanobis distance must be > 0, got {distance}")
    beta = -math.log(p / (1.0 - p)) / distance
    return float(1.0 - p - (1.0 - p) * norm.cdf(beta + distance / 2) - p * norm.cdf(beta - distance / 2))


@dataclass(frozen=True)
class GaussianSetting:
    """Eq. 9.1: y ∼ Bernoulli(p), x | y ∼ N(μ_y, Σ) with diagonal Σ = diag(var).

    Args:
        p: P(y = 1), in (0, 1).
        mu0 / mu1: the class means (1-D arrays of equal length).
        var: the per-feature variances (> 0), the diagonal of Σ.

    Returns:
        The setting; ``distance`` is the Mahalanobis distance D between the means and ``sample(n, rng,
        balanced=False)`` draws ``(x, y)``.

    Example:
        >>> s = GaussianSetting(0.5, np.zeros(2), np.ones(2), np.ones(2))
        >>> round(s.distance, 4)
        1.4142
        >>> s.sample(10, np.random.default_rng(0), balanced=True)[0].shape
        (10, 2)
    """

    p: float
    mu0: np.ndarray
    mu1: np.ndarray
    var: np.ndarray

    def __post_init__(self) -> None:
        if not 0.0 < self.p < 1.0:
            raise ConfigError(f"GaussianSetting: p must be in (0, 1), got {self.p}")
        if not (self.mu0.shape == self.mu1.shape == self.var.shape) or self.mu0.ndim != 1:
            raise ConfigError("GaussianSetting: mu0, mu1 and var must be 1-D arrays of the same length")
        if (self.var <= 0).any():
            raise ConfigError("GaussianSetting: variances must be > 0")

    @property
    def distance(self) -> float:
        """Mahalanobis distance D between the class means."""
        d = self.mu1 - self.mu0
        return float(np.sqrt(np.sum(d * d / self.var)))

    def sample(self, n: int, rng: np.random.Generator, balanced: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """n draws (x, y); ``balanced`` fixes the class counts at round(p·n) instead of drawing them."""
        if balanced:
            n1 = int(round(self.p * n))
            y = np.concatenate([np.zeros(n - n1, dtype=np.int64), np.ones(n1, dtype=np.int64)])
            rng.shuffle(y)
        else:
            y = (rng.random(n) < self.p).astype(np.int64)
        mu = np.where(y[:, None] == 1, self.mu1[None], self.mu0[None])
        return mu + rng.standard_normal((n, len(self.var))) * np.sqrt(self.var)[None], y


@dataclass(frozen=True)
class LinearModel:
    """A binary linear classifier: predict 1 iff wᵀx + b > 0 (weights in the input units).

    Args:
        w: the weight vector; b: the intercept.

    Returns:
        The model; ``decision(x)`` gives wᵀx + b per row, ``predict(x)`` the 0/1 labels.

    Example:
        >>> LinearModel(np.array([1.0, -1.0]), 0.0).predict(np.array([[2.0, 1.0], [0.0, 1.0]]))
        array([1, 0])
    """

    w: np.ndarray
    b: float

    def decision(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x) @ self.w + self.b

    def predict(self, x: np.ndarray) -> np.ndarray:
        return (self.decision(x) > 0).astype(np.int64)


def bayes_optimal(setting: GaussianSetting) -> LinearModel:
    """The Bayes-optimal predictor of Eq. 9.2 with the corrected intercept (LDA):
    w = Σ⁻¹(μ1 − μ0), b = −½(μ1 + μ0)ᵀw + log(p/(1 − p)).

    Args:
        setting: the :class:`GaussianSetting`.

    Returns:
        The optimal :class:`LinearModel`.

    Example:
        >>> m = bayes_optimal(asymmetric_gaussian(n_weak=10, weak_var=3.0))
        >>> m.w[:3].round(4).tolist(), round(m.b, 4)
        ([1.0, -1.0, 0.3333], -1.6667)
    """
    w = (setting.mu1 - setting.mu0) / setting.var
    b = float(-0.5 * (setting.mu1 + setting.mu0) @ w + math.log(setting.p / (1.0 - setting.p)))
    return LinearModel(w, b)


def asymmetric_gaussian(n_weak: int = 1000, weak_var: float = 3.0, strong_var: float = 1.0, p: float = 0.5,
                        n_strong_per_class: int = 1) -> GaussianSetting:
    """Eq. 9.11: one (or more) strong feature per class and ``n_weak`` weak features oriented towards class 1.

    μ0 = (0, 1, 0, …, 0), μ1 = (1, 0, 1, …, 1): every feature's class means differ by 1; the strong features have
    variance ``strong_var`` (σ_s² = 1), the weak ones the *variance* ``weak_var`` (Sec. 9.3 uses σ_w² = 3 for
    Table 9.6; Fig. 9.3a writes "σ_w = 10" — pass ``weak_var=10`` or ``100`` to choose a reading).

    Args:
        n_weak: number of weak features (≥ 0).
        weak_var / strong_var: the variances of the weak and strong features (> 0).
        p: P(y = 1).
        n_strong_per_class: strong features per class (≥ 1).

    Returns:
        The :class:`GaussianSetting` with ``2 n_strong_per_class + n_weak`` features.

    Example:
        >>> s = asymmetric_gaussian(n_weak=1000, weak_var=3.0)   # Table 9.6's synthetic row: 1,002 features
        >>> len(s.var)
        1002
    """
    if n_weak < 0 or n_strong_per_class < 1 or weak_var <= 0 or strong_var <= 0:
        raise ConfigError("asymmetric_gaussian: need n_weak >= 0, n_strong_per_class >= 1 and positive variances")
    k = n_strong_per_class
    mu0 = np.concatenate([np.zeros(k), np.ones(k), np.zeros(n_weak)])
    mu1 = np.concatenate([np.ones(k), np.zeros(k), np.ones(n_weak)])
    var = np.concatenate([np.full(2 * k, float(strong_var)), np.full(n_weak, float(weak_var))])
    return GaussianSetting(float(p), mu0, mu1, var)


def asymmetry(x: np.ndarray, y: np.ndarray) -> float:
    """Fraction of features oriented towards y = 1: sign(mean(x | y=1) − mean(x | y=0)) > 0 (Table 9.6 "asymm.").

    The digest notes the learned weights are far less asymmetric than the data, so this uses class means.

    Args:
        x: the features (N, d); y: binary 0/1 labels with both classes present (else ``DataError``).

    Returns:
        The fraction in [0, 1].

    Example:
        >>> asymmetry(np.array([[0.0, 1.0], [1.0, 0.0]]), np.array([0, 1]))
        0.5
    """
    x, y = np.asarray(x), np.asarray(y)
    if not ((y == 0).any() and (y == 1).any()):
        raise DataError("asymmetry: both classes must be present")
    diff = x[y == 1].mean(0) - x[y == 0].mean(0)
    return float(np.mean(diff > 0))


def weak_weight_error(w_hat: np.ndarray, w_opt: np.ndarray, n_strong: int = 2) -> float:
    """(1/n) Σ_i (ŵ_{i+n_strong} − w_{i+n_strong}): the signed error of the weak-feature weights (Fig. 9.3c);
    positive = SGD over-estimates the weak features. Weights must be on the same scale (e.g. both in the units of
    the raw features).

    Args:
        w_hat: the learned weights; w_opt: the optimal ones (same length > ``n_strong``).
        n_strong: the leading strong features to skip.

    Returns:
        The mean signed error over the weak features.

    Example:
        >>> round(weak_weight_error(np.array([1.0, -1.0, 0.5, 0.5]), np.array([1.0, -1.0, 0.3, 0.3])), 6)
        0.2
    """
    w_hat, w_opt = np.asarray(w_hat, dtype=float).ravel(), np.asarray(w_opt, dtype=float).ravel()
    if w_hat.shape != w_opt.shape or len(w_hat) <= n_strong:
        raise ConfigError("weak_weight_error: weight vectors must have equal length > n_strong")
    return float(np.mean(w_hat[n_strong:] - w_opt[n_strong:]))


def mahalanobis_distance(x: np.ndarray, y: np.ndarray, pooled: str = "diagonal") -> float:
    """D between the class means of a binary data set, with the pooled within-class covariance ("diagonal" or
    "full"). Table 9.2 does not say how its D was computed, and neither choice reproduces its values (digest §5);
    this is reported for context, never used as a test target.

    Args:
        x: the features (N, d); y: binary 0/1 labels.
        pooled: ``"diagonal"`` or ``"full"`` pooled within-class covariance (else ``ConfigError``).

    Returns:
        The distance D.

    Example:
        >>> x = np.array([[0.0], [0.5], [1.0], [1.5]])
        >>> mahalanobis_distance(x, np.array([0, 0, 1, 1]))
        4.0
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y)
    d = x[y == 1].mean(0) - x[y == 0].mean(0)
    resid = np.concatenate([x[y == 1] - x[y == 1].mean(0), x[y == 0] - x[y == 0].mean(0)])
    if pooled == "diagonal":
        var = resid.var(0)
        var[var == 0] = 1.0
        return float(np.sqrt(np.sum(d * d / var)))
    if pooled == "full":
        cov = np.cov(resid, rowvar=False)
        return float(np.sqrt(d @ np.linalg.pinv(cov) @ d))
    raise ConfigError(f"mahalanobis_distance: pooled={pooled!r}; valid choices: 'diagonal', 'full'")


def majority_as_one(y: np.ndarray) -> tuple[np.ndarray, bool]:
    """Relabel a binary label vector so that 1 is the majority class (the convention of Def. 9.1); returns the
    labels and whether they were flipped. Ties (p* = 1/2) keep the labels as given."""
    y = np.asarray(y).astype(np.int64)
    if not np.isin(y, (0, 1)).all():
        raise DataError("labels must be binary 0/1")
    if y.mean() < 0.5:
        return 1 - y, True
    return y, False
