"""Learners (§9.2, Fig. 9.4), mitigations (§9.3) and the deep head (§2.14), on small data."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from modelward.bias.amplification import asymmetric_gaussian, bias_amplification
from modelward.bias.learners import (
    SGDSchedule,
    fit_lbfgs_logistic,
    fit_learner,
    fit_linear_svm,
    fit_sgd,
    linear_head,
    penultimate_features,
)
from modelward.errors import ConfigError


def test_sgd_is_bias_amplifying_on_asymmetric_data_and_lbfgs_svm_less() -> None:
    """Fig. 9.3–9.4 in miniature: constant-LR SGD logistic regression predicts the weak-feature class in excess
    (p* = 1/2); L-BFGS logistic regression and the SMO SVM much less."""
    s = asymmetric_gaussian(n_weak=300, weak_var=3.0)
    sgd, lbfgs, svm = [], [], []
    for r in range(4):
        rng = np.random.default_rng(r)
        xtr, ytr = s.sample(60, rng, balanced=True)
        xte, yte = s.sample(1000, rng, balanced=True)
        sgd.append(bias_amplification(fit_sgd(xtr, ytr, SGDSchedule(), seed=r).model.predict(xte), yte))
        lbfgs.append(bias_amplification(fit_lbfgs_logistic(xtr, ytr).model.predict(xte), yte))
        svm.append(bias_amplification(fit_linear_svm(xtr, ytr).model.predict(xte), yte))
    assert np.mean(sgd) > 0.1
    assert np.mean(lbfgs) < np.mean(sgd) / 2 and np.mean(svm) < np.mean(sgd) / 2


def test_learner_dispatch_and_errors() -> None:
    x = np.random.default_rng(0).normal(size=(20, 3))
    y = (x[:, 0] > 0).astype(int)
    assert fit_learner("gaussian_nb", x, y).predict(x).shape == (20,)
    with pytest.raises(ConfigError, match="valid choices"):
        fit_learner("xgboost", x, y)
    with pytest.raises(ConfigError, match="binary"):
        fit_learner("sgd", x, np.zeros(20))


def test_deep_linear_head_equals_the_network() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 2))
    x = torch.randn(30, 5)
    z = penultimate_features(net, x)
    head = linear_head(net, (0, 1))
    # equal classes, not equal numbers: the head computes in float64, the net in float32; the closest of these 30
    # logit pairs is 0.035 apart, far beyond float32 rounding on any kernels
    assert np.array_equal(head.predict(z), net(x).argmax(1).numpy())
    with pytest.raises(ConfigError, match="linear layers"):
        linear_head(net, head="1")
