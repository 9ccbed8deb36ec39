"""Learners (§9.2, Fig. 9.4), mitigations (§9.3) and the deep head (§2.14), on small data."""

from __future__ import annotations

import numpy as np
import pytest

from modelward.bias.amplification import LinearModel, asymmetric_gaussian, bias_amplification
from modelward.bias.learners import (
    SGDSchedule,
    fit_sgd,
)
from modelward.bias.mitigation import experts, feature_parity
from modelward.errors import ConfigError


def test_feature_parity_removes_weakest_of_the_larger_side() -> None:
    m = LinearModel(np.array([3.0, 0.2, 0.5, 1.0, -2.0, -0.1]), 0.0)
    means = np.array([0, 2.0, 1.0, 0, 0, 0])
    r = feature_parity(m, means, "subtract")
    # 4 positive vs 2 negative: the two weakest positives (0.2, 0.5) go
    assert list(r.kept) == [True, False, False, True, True, True]
    assert np.array_equal(r.model.w, [3.0, 0, 0, 1.0, -2.0, -0.1])
    assert r.model.b == pytest.approx(-(0.2 * 2.0 + 0.5 * 1.0))  # the thesis's "subtract"
    assert feature_parity(m, means, "add").model.b == pytest.approx(0.9)
    assert feature_parity(m, None, "none").model.b == 0.0
    with pytest.raises(ConfigError, match="means"):
        feature_parity(m, None, "subtract")


def test_experts_never_lowers_training_accuracy_and_reduces_training_bias() -> None:
    rng = np.random.default_rng(0)
    s = asymmetric_gaussian(n_weak=100, weak_var=10.0)
    x, y = s.sample(300, rng, balanced=True)
    m = fit_sgd(x, y, SGDSchedule(max_iter=3, tol=None), seed=0).model  # stopped early: biased towards 1
    r = experts(m, x, y)
    assert r.info["train_bias_before"] > 0.02  # the premise: SGD before convergence over-predicts class 1
    assert r.info["train_acc_after"] >= r.info["train_acc_before"]
    assert abs(r.info["train_bias_after"]) < 0.5 * r.info["train_bias_before"]
    assert r.kept.sum() < (m.w != 0).sum()  # it removed weak features
    # the kept set is the α most positive and β most negative features
    w = m.w
    kept_pos = np.flatnonzero(r.kept & (w > 0))
    if len(kept_pos):
        assert w[kept_pos].min() >= w[(w > 0) & ~r.kept].max(initial=-np.inf)
    pred = r.model.predict(x)
    assert bias_amplification(pred, y) == pytest.approx(r.info["train_bias_after"])
