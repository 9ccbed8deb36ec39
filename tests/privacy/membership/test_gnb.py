"""Closed-form Gaussian naive-Bayes attacks (Eq. 8.4, Eq. 8.9) against the Bayes posterior computed by hand."""

from __future__ import annotations

import numpy as np
from scipy import stats

from modelward.privacy.membership.gnb import GaussianNBAttack, gaussian_classes


def _posterior_by_hand(x: np.ndarray, y: np.ndarray, mu_hat, s_hat, mu_star, s_star) -> np.ndarray:
    # Pr[T | x, y] with Pr[T] = ½: density ratio of D̂ (members) to D* (population), per feature (naive Bayes)
    log_in = stats.norm.logpdf(x, mu_hat[y], s_hat).sum(1)
    log_out = stats.norm.logpdf(x, mu_star[y], s_star).sum(1)
    return 1.0 / (1.0 + np.exp(log_out - log_in))


def test_unequal_variance_attack_equals_bayes_posterior_on_2d_gaussian() -> None:
    rng = np.random.default_rng(0)
    mu_star = np.array([[0.0, 1.0], [2.0, -1.0]])
    s_star = np.array([1.0, 0.7])
    mu_hat = mu_star + np.array([[0.3, -0.2], [-0.1, 0.4]])
    s_hat = np.array([0.8, 0.9])
    x = rng.normal(size=(200, 2)) * 1.5
    y = rng.integers(0, 2, 200)
    a = GaussianNBAttack(mu_hat, s_hat, mu_star, s_star)
    np.testing.assert_allclose(a.probability(x, y), _posterior_by_hand(x, y, mu_hat, s_hat, mu_star, s_star),
                               rtol=1e-10, atol=1e-12)
    assert not np.allclose(a.v, 0)  # unequal variances: the quadratic term is present


def test_equal_variances_make_the_attack_linear_theorem_8_1() -> None:
    mu_star = np.array([[0.0, 1.0], [2.0, -1.0]])
    s = np.array([1.0, 0.5])
    mu_hat = mu_star + 0.25
    a = GaussianNBAttack(mu_hat, s, mu_star, s)
    np.testing.assert_array_equal(a.v, 0.0)
    np.testing.assert_allclose(a.w, (mu_hat - mu_star) / s ** 2)  # Eq. 8.4 weights
    np.testing.assert_allclose(a.b, ((mu_star ** 2 - mu_hat ** 2) / (2 * s ** 2)).sum(1))  # Eq. 8.4 bias
    x = np.array([[0.1, 0.2], [1.0, -2.0]])
    y = np.array([0, 1])
    np.testing.assert_allclose(a.probability(x, y), _posterior_by_hand(x, y, mu_hat, s, mu_star, s), rtol=1e-10)


def test_omniscient_attack_beats_chance_on_the_synthetic_generator() -> None:
    x, y, mu, sd = gaussian_classes(400, seed=1)
    members, nonmembers = slice(0, 100), slice(100, 200)
    a = GaussianNBAttack.omniscient(x[members], y[members], mu, sd)
    s_in, s_out = a.score(x[members], y[members]), a.score(x[nonmembers], y[nonmembers])
    acc = ((s_in > 0).mean() + (s_out <= 0).mean()) / 2
    assert acc > 0.75  # d = 75 features, 10 members per class: the literal reading is strong (digest §8.4)
