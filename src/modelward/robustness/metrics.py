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

from modelward.core.device import model_device
from modelward.errors import ConfigError
from modelward.robustness.attacks import (
    EvasionAttack,
    ThreatModel,
    attack_mode,
    attack_params,
    make_attack,
    predict,
    threat_model,
)

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


def prepare_params(name: str, params: dict[str, Any] | None, norm: str | None) -> tuple[dict[str, Any], ThreatModel]:
    """The attack's parameters for a sweep in ``norm`` (None: any) and its threat model; ConfigError if the attack
    cannot be compared in that norm. An attack with a ``norm`` parameter that was not set follows the sweep's norm
    (FGSM in an ℓ2 table is the L2 fast-gradient method, not the L∞ default)."""
    params = dict(params or {})
    if norm is not None and "norm" not in params and "norm" in attack_params(name):
        params["norm"] = norm
    tm = threat_model(name, params)
    if norm is not None and tm.norm != norm:
        raise ConfigError(f"attack {name!r} attacks in {tm.norm}, the sweep is in {norm}: its robust accuracy is not "
                          f"comparable (set the attack's norm, or evaluate it in a {tm.norm} sweep)")
    if not tm.takes_eps and tm.norm != "l2":
        raise ConfigError(f"attack {name!r} takes no ε (its budget is its own parameter, in {tm.norm}); run it "
                          "directly with make_attack instead of an ε sweep")
    return params, tm


def robust_accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, attack_factory: AttackFactory,
                    eps_list: Sequence[float], attack_params: dict[str, Any] | None = None,
                    norm: str | None = None) -> list[RobustPoint]:
    """One RobustPoint per ε in ``eps_list`` (untargeted attacks).

    ε-ball attacks run once per ε. Minimum-norm ℓ2 attacks (C&W, L-BFGS; ``takes_eps = False``) run once, and a
    point counts as broken at ε when the attack succeeded with ‖δ‖₂ ≤ ε — the same threat model as an ℓ2 ε-ball
    attack. ``norm`` (optional) is the sweep's norm: attacks of another norm are refused, and attacks with a
    ``norm`` parameter not given in ``attack_params`` use it.

    Args:
        model: the classifier (returns logits).
        x, y: the evaluation points and labels.
        attack_factory: an attack name (``"pgd"``, ...) or a callable ``(model, eps) -> EvasionAttack``.
        eps_list: the radii ε (0 = clean accuracy).
        attack_params: extra parameters of a named attack.
        norm: the sweep's norm (optional).

    Returns:
        One :class:`RobustPoint` (``eps``, ``clean_accuracy``, ``robust_accuracy``, ``success_rate``, ``n``) per ε.

    Example:
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
        >>> pts = robust_accuracy(model, torch.rand(10, 16), torch.randint(3, (10,)), "fgsm", [0.0, 0.1])
        >>> pts[0].robust_accuracy == pts[0].clean_accuracy and pts[1].robust_accuracy <= pts[0].robust_accuracy
        True
    """
    params = dict(attack_params or {})

    x, y = x.to(model_device(model)), y.to(model_device(model))  # evaluated where the model is
    tm = None
    if isinstance(attack_factory, str):
        params, tm = prepare_params(attack_factory, params, norm)
    with attack_mode(model):
        correct = predict(model, x) == y
    clean = float(correct.float().mean())
    broken_at: torch.Tensor | None = None
    if tm is not None and not tm.takes_eps:  # minimum-norm attack: one run, thresholded per ε
        assert isinstance(attack_factory, str)
        res = make_attack(attack_factory, model, **params)(x, y)
        dist = (res.x_adv - x).flatten(1).norm(dim=1)
        broken_at = torch.where(res.success, dist, torch.full_like(dist, float("inf")))
    out = []
    for eps in eps_list:
        if eps == 0:
            still = correct
        elif broken_at is not None:
            still = correct & ~(broken_at <= float(eps) * (1 + 1e-6))
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
    # lazy: matplotlib on first figure only (cli.robust loads this module for `modelward robust --help`)
    from modelward.core.plots import line_plot

    series = {label: ([p.eps for p in pts], [p.robust_accuracy for p in pts]) for label, pts in curves.items()}
    return line_plot(path, series, title, "ε", "robust accuracy")
