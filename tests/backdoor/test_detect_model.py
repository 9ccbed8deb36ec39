"""Model-level detection: the statistics' arithmetic, and Neural Cleanse / MM-BD on a backdoored and a clean
digits model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from modelward.backdoor.detect.model.mmbd import MMBD, margin_p_value
from modelward.backdoor.detect.model.neural_cleanse import NeuralCleanse, anomaly_index
from modelward.backdoor.experiment import Trained, defender_split
from modelward.errors import ConfigError

from .conftest import TARGET


def test_anomaly_index_is_the_mad_distance_of_the_smallest_norm() -> None:
    norms = [10.0, 11.0, 9.0, 10.0, 12.0, 10.0, 2.0, 11.0, 10.0, 9.0]
    ai, k = anomaly_index(norms)
    med = np.median(norms)
    mad = 1.4826 * np.median(np.abs(np.array(norms) - med))
    assert k == 6 and ai == pytest.approx((med - 2.0) / mad)
    assert anomaly_index([5.0, 5.0, 5.0, 5.0])[0] == 0.0  # no smaller one: nothing anomalous
    assert anomaly_index([5.0, 5.0, 5.0, 1.0])[0] == math.inf  # MAD 0 and one below: infinitely anomalous


def test_margin_p_value_is_the_gamma_order_statistic() -> None:
    from scipy.stats import gamma

    r = [5.1, 4.8, 5.5, 5.0, 4.9, 5.2, 5.3, 4.7, 5.0, 9.0]
    p, k = margin_p_value(r)
    a, loc, scale = gamma.fit(r[:-1])
    assert k == 9 and p == pytest.approx(1 - gamma.cdf(9.0, a, loc, scale) ** 10)
    assert p < 0.05
    p_typical, _ = margin_p_value([5.1, 4.8, 5.5, 5.0, 4.9, 5.2, 5.3, 4.7, 5.0, 5.4])
    assert p_typical > 0.05


def test_neural_cleanse_finds_the_target_and_its_small_trigger(backdoored: Trained, clean: Trained) -> None:
    (xd, _), (xe, ye) = defender_split(backdoored.data, 0)
    nc = NeuralCleanse(epochs=30)
    v = nc.detect(backdoored.model, xd[:100], 10)
    assert v.backdoored and v.suspect_class == TARGET and v.statistic > 2
    others = [n for k, n in enumerate(v.per_class) if k != TARGET]
    assert v.per_class[TARGET] < 0.5 * float(np.median(others))  # a 2×2 patch (L1 4) against ~15 for the others
    trig = nc.last.trigger(TARGET)
    keep = ye != TARGET
    hits = (backdoored.model(trig.apply(xe[keep])).argmax(1) == TARGET).float().mean()
    assert hits > 0.9  # the reversed trigger works on held-out inputs too
    vc = NeuralCleanse(epochs=30).detect(clean.model, xd[:100], 10)
    assert vc.statistic < v.statistic


def test_mmbd_flags_the_backdoored_model_without_data(backdoored: Trained, clean: Trained) -> None:
    det = MMBD(starts=10, steps=60, optimizer="adam", lr=0.05)
    v = det.detect(backdoored.model, (1, 8, 8), 10)
    assert v.backdoored and v.suspect_class == TARGET and v.p_value is not None and v.p_value < 0.05
    assert v.statistic == pytest.approx(-math.log10(v.p_value))
    vc = det.detect(clean.model, (1, 8, 8), 10)
    assert vc.statistic < v.statistic and max(vc.per_class) < max(v.per_class)
    with pytest.raises(ConfigError, match="3 classes"):
        det.detect(backdoored.model, (1, 8, 8), 2)


def test_detectors_leave_the_model_as_they_found_it(backdoored: Trained) -> None:
    m = backdoored.model
    m.train()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    flags = [p.requires_grad for p in m.parameters()]
    MMBD(starts=2, steps=3).detect(m, (1, 8, 8), 10)
    NeuralCleanse(epochs=1).detect(m, backdoored.data.x_test[:40], 10)
    assert m.training and [p.requires_grad for p in m.parameters()] == flags
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    m.eval()
