"""Robust accuracy under an attack, swept over ε, and the robustness curve plot.

``robust_accuracy(model, x, y, attack_factory, eps_list)`` runs the attack at every ε and returns one
:class:`RobustPoint` per ε. ``attack_factory`` is either an attack name (see ``ATTACK_NAMES``; extra keyword
parameters go in ``attack_params``) or a callable ``(model, eps) -> EvasionAttack``. ε = 0 gives clean accuracy.
Robust accuracy = fraction of all points still classified correctly after the attack; the attack success rate
counts among the points that were correct to begin with (digest §8.3 asks to state the denominator).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from modelward.robustness.attacks import EvasionAttack, attack_mode, make_attack, predict

AttackFactory = str | Callable[[nn.Module, float], EvasionAttack]


@dataclass(frozen=True)
class RobustPoint:
    eps: float
    clean_accuracy: float  # on all n points
    robust_accuracy: float  # on all n points, after the attack
    success_rate: float  # among the initially-correct points: fraction the attack flipped
    n: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _build(factory: AttackFactory, model: nn.Module, eps: float, params: dict[str, Any]) -> EvasionAttack:
    if isinstance(factory, str):
        return make_attack(factory, model, eps=eps, **params)
    return factory(model, eps)


def robust_accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, attack_factory: AttackFactory,
                    eps_list: Sequence[float], attack_params: dict[str, Any] | None = None) -> list[RobustPoint]:
    """One RobustPoint per ε in ``eps_list`` (untargeted attacks)."""
    params = dict(attack_params or {})
    with attack_mode(model):
        correct = predict(model, x) == y
    clean = float(correct.float().mean())
    out = []
    for eps in eps_list:
        if eps == 0:
            still = correct
        else:
            res = _build(attack_factory, model, float(eps), params)(x, y)
            still = ~res.success
        n_ok = int(correct.sum())
        flipped = int((correct & ~still).sum())
        out.append(RobustPoint(float(eps), clean, float(still.float().mean()),
                               flipped / n_ok if n_ok else 0.0, len(y)))
    return out


def robustness_curve_plot(path: str | Path, curves: dict[str, Sequence[RobustPoint]],
                          title: str = "Robust accuracy vs ε") -> Path:
    """Robust accuracy (y) against ε (x), one line per labelled curve."""
    from modelward.core.plots import line_plot

    series = {label: ([p.eps for p in pts], [p.robust_accuracy for p in pts]) for label, pts in curves.items()}
    return line_plot(path, series, title, "ε", "robust accuracy")
