"""B_D(h), Theorem 9.1 (corrected sign), the Bayes-optimal predictor and the Eq. 9.11 generator (seed 002 §9.1–9.2)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from modelward.bias.amplification import (
    GaussianSetting,
    asymmetric_gaussian,
    asymmetry,
    bayes_optimal,
    bias_amplification,
    majority_as_one,
    theorem_9_1,
    weak_weight_error,
)
from modelward.errors import ConfigError, DataError


def test_bias_definition() -> None:
    assert bias_amplification(np.array([1, 1, 1, 0]), np.array([1, 1, 0, 0])) == pytest.approx(0.25)
    assert bias_amplification(np.array([0, 0]), np.array([1, 0])) == pytest.approx(-0.5)
    with pytest.raises(DataError, match="binary"):
        bias_amplification(np.array([2, 0]), np.array([1, 0]))


def test_theorem_closed_form_values() -> None:
    assert theorem_9_1(0.75, 0.5) == pytest.approx(0.2382, abs=5e-5)  # worked example of §9.1
    assert theorem_9_1(0.5, 1.3) == pytest.approx(0.0, abs=1e-12)  # Corollary 9.2
    # B ≤ 1 − p* and → 1 − p* as the classes become inseparable
    assert 0 < theorem_9_1(0.7, 1.0) < 0.3
    assert theorem_9_1(0.7, 1e-3) == pytest.approx(0.3, abs=1e-6)
    # the printed Eq. 9.8 sign (β = +log(odds)/D) would give a different, wrong value
    p, d = 0.7, 1.0
    wrong = 1 - p - (1 - p) * _phi(math.log(p / (1 - p)) / d + d / 2) - p * _phi(math.log(p / (1 - p)) / d - d / 2)
    assert abs(wrong - theorem_9_1(p, d)) > 0.05
    with pytest.raises(ConfigError):
        theorem_9_1(0.7, 0.0)


def _phi(t: float) -> float:
    return 0.5 * (1 + math.erf(t / math.sqrt(2)))


@pytest.mark.parametrize("p,gap", [(0.7, 0.6), (0.6, 1.0)])
def test_theorem_matches_monte_carlo(p: float, gap: float) -> None:
    """Theorem 9.1 vs simulation of the Bayes-optimal predictor (agreement to sampling error)."""
    s = GaussianSetting(p, np.zeros(3), np.full(3, gap), np.array([1.0, 2.0, 0.5]))
    x, y = s.sample(200_000, np.random.default_rng(0))
    pred = bayes_optimal(s).predict(x)
    mc = bias_amplification(pred, y)
    se = np.std(pred - y) / math.sqrt(len(y))
    assert abs(mc - theorem_9_1(p, s.distance)) < 4 * se


def test_bayes_optimal_intercept_is_the_corrected_one() -> None:
    """Eq. 9.2 corrected: b = −½(μ1 + μ0)ᵀw + log(p/(1−p)); at p = 1/2 the boundary is the midpoint."""
    s = GaussianSetting(0.5, np.array([2.0, -1.0]), np.array([4.0, 1.0]), np.array([1.0, 4.0]))
    h = bayes_optimal(s)
    mid = (s.mu0 + s.mu1) / 2
    assert h.decision(mid[None])[0] == pytest.approx(0.0, abs=1e-12)
    assert np.allclose(h.w, (s.mu1 - s.mu0) / s.var)


def test_asymmetric_generator_eq_9_11() -> None:
    s = asymmetric_gaussian(n_weak=5, weak_var=3.0)
    assert np.array_equal(s.mu0, [0, 1, 0, 0, 0, 0, 0]) and np.array_equal(s.mu1, [1, 0, 1, 1, 1, 1, 1])
    assert np.array_equal(s.var, [1, 1, 3, 3, 3, 3, 3])
    x, y = s.sample(4000, np.random.default_rng(1), balanced=True)
    assert y.mean() == 0.5
    assert np.allclose(x[:, 2:][y == 0].var(0), 3.0, rtol=0.15)  # weak_var is a variance, not a std
    assert asymmetry(x, y) == pytest.approx(6 / 7)  # every weak feature and feature 0 point to y = 1
    opt = bayes_optimal(s)
    assert np.allclose(opt.w, [1, -1, 1 / 3, 1 / 3, 1 / 3, 1 / 3, 1 / 3])
    assert weak_weight_error(opt.w + np.r_[0, 0, [0.1] * 5], opt.w) == pytest.approx(0.1)


def test_majority_as_one() -> None:
    y, flipped = majority_as_one(np.array([0, 0, 1]))
    assert flipped and list(y) == [1, 1, 0]
    y, flipped = majority_as_one(np.array([0, 1]))
    assert not flipped
