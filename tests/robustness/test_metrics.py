"""Robust accuracy sweeps: monotone curves, one norm per table."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

from modelward.errors import ConfigError
from modelward.robustness.attacks import make_attack
from modelward.robustness.attacks.base import attack_mode, predict
from modelward.robustness.metrics import robust_accuracy, robustness_curve_plot

torch.set_num_threads(1)  # the CI box is shared; oversubscribed BLAS threads are 10-50x slower

EPS = 0.15
TOL = 1e-5


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    d = load_digits()
    return torch.tensor(d.data / 16, dtype=torch.float32).view(-1, 1, 8, 8), torch.tensor(d.target)


@pytest.fixture(scope="module")
def victim(digits) -> nn.Module:
    x, y = digits
    torch.manual_seed(0)
    m = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.Adam(m.parameters(), 1e-2)
    for _ in range(250):
        opt.zero_grad()
        F.cross_entropy(m(x[:1400]), y[:1400]).backward()
        opt.step()
    return m


@pytest.fixture(scope="module")
def batch(digits, victim) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = digits
    xs, ys = x[1400:], y[1400:]
    keep = predict(victim, xs) == ys  # attack only points the model gets right
    return xs[keep][:60], ys[keep][:60]


def _rand_success(model: nn.Module, x: torch.Tensor, y: torch.Tensor, delta: torch.Tensor) -> float:
    return float((predict(model, (x + delta).clamp(0, 1)) != y).float().mean())


def _in_box(x_adv: torch.Tensor) -> bool:
    return bool(x_adv.min() >= 0.0) and bool(x_adv.max() <= 1.0)


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


