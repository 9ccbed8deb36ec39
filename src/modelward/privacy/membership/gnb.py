"""Closed-form Gaussian naive-Bayes membership attacks (seed 002 §8.2.1, Theorem 8.1, Eq. 8.4 and Eq. 8.8–8.9).

Generative model (Eq. 8.2): y ∼ Cat(p*), x | y ∼ N(μ*_y, diag σ*²); the training set S is the distribution D̂ with
its empirical parameters (μ̂_y, σ̂). Pr[T | x, y] = σ(log N(x; μ̂_y, σ̂²) − log N(x; μ*_y, σ*²)) (Eq. 8.5–8.7; the
thesis' sigmoid sign typo is resolved to the standard σ(t) = 1/(1+e^{−t}), digest §0). Expanded (Eq. 8.9):

    log-odds = vᵀx² + wᵀx + b,  v_j = 1/(2σ*_j²) − 1/(2σ̂_j²),  w_j = μ̂_yj/σ̂_j² − μ*_yj/σ*_j²,
    b = Σ_j [μ*_yj²/(2σ*_j²) − μ̂_yj²/(2σ̂_j²) + log(σ*_j/σ̂_j)]

With σ̂ = σ* (Theorem 8.1, Eq. 8.4) v = 0 and the attack is linear. The omniscient attack of Table 8.6 uses the true
μ*, σ* and the members' empirical class means μ̂. Score = the log-odds (threshold 0 ⇔ Pr[T | x, y] > ½).
"""

from __future__ import annotations

import numpy as np
import torch

from modelward.errors import DataError
from modelward.privacy.membership.base import MembershipAttack


def class_means(x: np.ndarray, y: np.ndarray, num_classes: int) -> np.ndarray:
    out = np.zeros((num_classes, x.shape[1]))
    for c in range(num_classes):
        if (y == c).any():
            out[c] = x[y == c].mean(0)
    return out


class GaussianNBAttack(MembershipAttack):
    """Eq. 8.9 (general) / Eq. 8.4 (equal variances).

    Args:
        mu_hat: member (training-set) class means, shape (m, n); sigma_hat: member per-feature SD, shape (n,).
        mu_star: population class means (m, n); sigma_star: population per-feature SD (n,).
        log_prior_ratio: optional log(p̂_y / p*_y) per class (digest §2.1 [derived]); default 0.
    Example:
        >>> a = GaussianNBAttack.omniscient(x_members, y_members, mu_star, sigma_star)
        >>> a.score(x, y)   # log-odds of membership; > 0 ⇔ Pr[T | x, y] > ½
    """

    name = "gnb"
    threshold = 0.0

    def __init__(self, mu_hat: np.ndarray, sigma_hat: np.ndarray, mu_star: np.ndarray, sigma_star: np.ndarray,
                 log_prior_ratio: np.ndarray | None = None) -> None:
        self.mu_hat = np.asarray(mu_hat, dtype=np.float64)
        self.mu_star = np.asarray(mu_star, dtype=np.float64)
        self.s_hat = np.broadcast_to(np.asarray(sigma_hat, dtype=np.float64), self.mu_hat.shape[1:]).copy()
        self.s_star = np.broadcast_to(np.asarray(sigma_star, dtype=np.float64), self.mu_hat.shape[1:]).copy()
        if self.mu_hat.shape != self.mu_star.shape:
            raise DataError(f"mu_hat {self.mu_hat.shape} and mu_star {self.mu_star.shape} differ in shape")
        if (self.s_hat <= 0).any() or (self.s_star <= 0).any():
            raise DataError("standard deviations must be > 0")
        m = self.mu_hat.shape[0]
        self.log_prior = np.zeros(m) if log_prior_ratio is None else np.asarray(log_prior_ratio, dtype=np.float64)
        vh, vs = self.s_hat ** 2, self.s_star ** 2
        self.v = 1 / (2 * vs) - 1 / (2 * vh)  # (n,)
        self.w = self.mu_hat / vh - self.mu_star / vs  # (m, n)
        self.b = ((self.mu_star ** 2) / (2 * vs) - (self.mu_hat ** 2) / (2 * vh)).sum(1) + \
            np.log(self.s_star / self.s_hat).sum() + self.log_prior  # (m,)

    @classmethod
    def omniscient(cls, x_members: np.ndarray, y_members: np.ndarray, mu_star: np.ndarray,
                   sigma_star: np.ndarray) -> GaussianNBAttack:
        """Eq. 8.4: true μ*, σ*; μ̂ = members' empirical class means; σ̂ = σ* (Theorem 8.1's assumption)."""
        mu_hat = class_means(np.asarray(x_members), np.asarray(y_members), len(mu_star))
        return cls(mu_hat, sigma_star, mu_star, sigma_star)

    @classmethod
    def unequal_variance(cls, x_members: np.ndarray, y_members: np.ndarray, mu_star: np.ndarray,
                         sigma_star: np.ndarray) -> GaussianNBAttack:
        """Eq. 8.9 with σ̂ = the members' pooled within-class per-feature SD (D̂'s own variance)."""
        x, y = np.asarray(x_members, dtype=np.float64), np.asarray(y_members)
        mu_hat = class_means(x, y, len(mu_star))
        resid = x - mu_hat[y]
        s_hat = np.sqrt((resid ** 2).mean(0)).clip(1e-6)
        return cls(mu_hat, s_hat, mu_star, sigma_star)

    def score(self, x: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray) -> np.ndarray:
        xx = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
        yy = np.asarray(y).astype(int)
        return (xx ** 2) @ self.v + (self.w[yy] * xx).sum(1) + self.b[yy]

    def probability(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-self.score(x, y)))


def gaussian_classes(n: int, num_classes: int = 10, n_features: int = 75, seed: int = 0
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The synthetic data of §8.2.3: μ_yj ∼ U[0, 1], Σ_jj ∼ U[0.5, 1.5] (a variance), equal records per class.

    Returns (x, y, mu_star (m, n), sigma_star (n,) = sqrt of the diagonal).
    """
    rng = np.random.default_rng(seed)
    mu = rng.uniform(0, 1, (num_classes, n_features))
    var = rng.uniform(0.5, 1.5, n_features)
    y = np.repeat(np.arange(num_classes), int(np.ceil(n / num_classes)))[:n]
    rng.shuffle(y)
    x = mu[y] + rng.standard_normal((n, n_features)) * np.sqrt(var)
    return x.astype(np.float32), y.astype(np.int64), mu, np.sqrt(var)
