"""Randomized smoothing (Cohen et al. 2019, Algorithm 1) on a classifier whose smoothed answer is known in closed
form: f(x) = [x₀ > 0] has p_A = Φ(|x₀|/σ), so the exact certified radius is |x₀|."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import binom
from torch import nn

from modelward.core.train import TrainConfig
from modelward.errors import ConfigError
from modelward.robustness.smoothing import ABSTAIN, SmoothedClassifier, clopper_pearson_lower, train_gaussian

torch.set_num_threads(1)


def _halfplane() -> nn.Module:
    """Class 0 iff x₀ > 0 (logits ±x₀): the smoothed classifier's radius at x is exactly |x₀|."""
    f = nn.Linear(3, 2)
    with torch.no_grad():
        f.weight.copy_(torch.tensor([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]]))
        f.bias.zero_()
    return f


def test_clopper_pearson_is_the_exact_one_sided_bound():
    for k, n, a in [(990, 1000, 0.001), (60, 100, 0.05), (1, 10, 0.01)]:
        p = clopper_pearson_lower(k, n, a)
        assert binom.sf(k - 1, n, p) == pytest.approx(a, rel=1e-6)  # P(Bin(n, p) ≥ k) = α at the bound
    assert clopper_pearson_lower(0, 10, 0.01) == 0.0


def test_certify_recovers_the_known_radius_from_below_and_abstains_on_the_boundary():
    g = SmoothedClassifier(_halfplane(), num_classes=2, sigma=1.0, batch_size=4000, seed=0)
    x = torch.tensor([[1.5, 0.3, -2.0], [-0.8, 5.0, 0.0], [0.0, 1.0, 1.0]])
    y = torch.tensor([0, 1, 0])
    cert = g.certify(x, y, n0=100, n=20_000, alpha=0.001)
    assert cert.predictions.tolist() == [0, 1, ABSTAIN]
    true_r = x[:2, 0].abs().double()
    assert bool((cert.radii[:2] <= true_r).all())  # sound (holds with prob. ≥ 1 − α per point)
    assert bool((cert.radii[:2] >= true_r - 0.15).all())  # and tight with n = 20,000
    assert float(cert.radii[2]) == 0.0 and cert.abstain_rate == pytest.approx(1 / 3)
    assert cert.certified_accuracy(0.5) == pytest.approx(2 / 3) and cert.certified_accuracy(1.6) == 0.0
    again = g.certify(x, y, n0=100, n=20_000, alpha=0.001)
    assert torch.equal(again.radii, cert.radii)  # seeded


def test_predict_returns_the_class_or_abstains_by_the_binomial_test():
    g = SmoothedClassifier(_halfplane(), num_classes=2, sigma=0.5, batch_size=1000, seed=1)
    pred = g.predict(torch.tensor([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]), n=2000, alpha=0.001)
    assert pred.tolist() == [0, 1, ABSTAIN]


def test_radius_is_never_above_the_truth_across_points():
    g = SmoothedClassifier(_halfplane(), num_classes=2, sigma=0.5, batch_size=2000, seed=2)
    x0 = torch.linspace(0.05, 1.5, 12)
    x = torch.stack([x0, torch.zeros(12), torch.zeros(12)], 1)
    cert = g.certify(x, torch.zeros(12, dtype=torch.long), n0=50, n=2000, alpha=0.01)
    assert bool((cert.radii <= x0.double() + 1e-12).all())


def test_bad_parameters_are_refused():
    with pytest.raises(ConfigError, match="sigma"):
        SmoothedClassifier(_halfplane(), 2, sigma=0.0)
    g = SmoothedClassifier(_halfplane(), 2, sigma=0.5)
    with pytest.raises(ConfigError, match="alpha"):
        g.certify(torch.zeros(1, 3), torch.zeros(1, dtype=torch.long), alpha=1.5)


def test_gaussian_training_certifies_digits(digits):
    x_tr, y_tr, x_te, y_te = digits
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    train_gaussian(model, x_tr, y_tr, TrainConfig(optimizer="adam", lr=3e-3, steps=150, batch_size=128),
                   sigma=0.25, seed=0)
    g = SmoothedClassifier(model, 10, sigma=0.25, batch_size=1000, seed=0)
    cert = g.certify(x_te[:12], y_te[:12], n0=50, n=1000, alpha=0.001)
    assert cert.certified_accuracy(0.25) >= 0.5
    assert bool((cert.radii[cert.predictions == ABSTAIN] == 0).all())
