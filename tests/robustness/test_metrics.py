"""Robust accuracy sweeps: monotone curves, one norm per table."""

from __future__ import annotations

import pytest
import torch

from modelward.errors import ConfigError
from modelward.robustness.attacks import make_attack
from modelward.robustness.attacks.base import attack_mode, predict
from modelward.robustness.metrics import robust_accuracy, robustness_curve_plot

torch.set_num_threads(1)  # the CI box is shared; oversubscribed BLAS threads are 10-50x slower


def test_robust_accuracy_curve_is_monotone(victim, batch, tmp_path):
    x, y = batch
    pts = robust_accuracy(victim, x, y, "pgd", [0.0, 0.05, 0.1, 0.2], {"steps": 10})
    assert pts[0].robust_accuracy == pts[0].clean_accuracy == 1.0
    accs = [p.robust_accuracy for p in pts]
    assert all(a >= b for a, b in zip(accs, accs[1:], strict=False)) and accs[-1] < 0.5
    assert pts[-1].success_rate == pytest.approx(1 - accs[-1])
    out = robustness_curve_plot(tmp_path / "curve.png", {"pgd": pts})
    assert out.stat().st_size > 1000


def test_sweep_compares_only_attacks_of_its_norm(victim, batch):
    x, y = batch
    x, y = x[:40], y[:40]
    # FGSM without a norm follows the sweep's: in an ℓ2 sweep it is the L2 fast-gradient method
    l2 = robust_accuracy(victim, x, y, "fgsm", [0.5], {}, norm="l2")[0]
    explicit = robust_accuracy(victim, x, y, "fgsm", [0.5], {"norm": "l2"})[0]
    linf = robust_accuracy(victim, x, y, "fgsm", [0.5], {})[0]
    assert l2.robust_accuracy == explicit.robust_accuracy != linf.robust_accuracy
    with pytest.raises(ConfigError, match="linf.*l2"):
        robust_accuracy(victim, x, y, "fgsm", [0.5], {"norm": "linf"}, norm="l2")
    with pytest.raises(ConfigError, match="attacks in linf"):
        robust_accuracy(victim, x, y, "bim", [0.5], {}, norm="l2")
    with pytest.raises(ConfigError, match="takes no ε"):
        robust_accuracy(victim, x, y, "jsma", [0.5], {})
    # C&W takes no ε: it runs once and a point is broken at ε when its perturbation is within the ℓ2 ball
    cw = robust_accuracy(victim, x, y, "cw", [0.0, 0.3, 1.0, 3.0], {"steps": 30, "binary_steps": 4, "lr": 0.05},
                         norm="l2")
    accs = [p.robust_accuracy for p in cw]
    assert accs == sorted(accs, reverse=True) and accs[1] > accs[-1]
    res = make_attack("cw", victim, steps=30, binary_steps=4, lr=0.05)(x, y)
    d = (res.x_adv - x).flatten(1).norm(dim=1)
    with attack_mode(victim):
        correct = predict(victim, x) == y
    assert accs[2] == pytest.approx(float((correct & ~(res.success & (d <= 1.0 + 1e-6))).float().mean()))


