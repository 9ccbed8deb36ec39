"""Prediction-perturbation defenses against model extraction (ModelGuard paper, Sec. 3 and App. B.2).

``make_defense(name, **params)`` builds one by name. Names and their parameters:

=========================  ==========================================================================================
``none``                   —
``modelguard_w``           ``epsilon`` (ℓ1 budget, default 1.0), ``solver`` ("fast" | "lp"), ``margin`` (1e-4)
``modelguard_s``           ``epsilon`` (default 1.0), ``ordered`` (True; False = the Table 6 nearest-centroid ablation)
``reverse_sigmoid``        ``beta`` (default 0.2), ``gamma`` (default 0.2)
``mad``                    ``epsilon`` (default 1.0), ``surrogate`` (**required** nn.Module: the random-init surrogate
                           whose last-FC-weight Jacobian defines G), ``max_evals`` (1024, greedy oracle for K > 10)
``adaptive_misinformation`` ``tau`` (default 0.5), ``nu`` (default 1000), ``misinformation`` (**required** nn.Module
                           returning logits: the misinformation model f̂)
``top1``                   —
``rounding``               ``decimals`` (default 1; largest-remainder rounding so the output sums to 1)
``gaussian_noise``         ``sigma`` (default 0.05), ``seed`` (default 0)
=========================  ==========================================================================================

Example: ``make_defense("mad", epsilon=1.0, surrogate=build_model(cfg, shape, k))``, or from a config section
``build_defense(spec, {"surrogate": lambda: build_model(cfg, shape, k)})`` — the one place that supplies the models a
defense declares in ``needs``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from torch import nn

from modelward.core.registry import Registry, lazy_exports
from modelward.errors import ConfigError
from modelward.extraction.defenses.base import (
    IncrementalState,
    NoDefense,
    PredictionDefense,
    as_probs,
    is_in_simplex,
    l1_distortion,
    top1_kept,
)

_CLASSES: dict[str, str] = {
    "ModelGuardW": "modelward.extraction.defenses.modelguard_w:ModelGuardW",
    "ModelGuardS": "modelward.extraction.defenses.modelguard_s:ModelGuardS",
    "ReverseSigmoid": "modelward.extraction.defenses.reverse_sigmoid:ReverseSigmoid",
    "MAD": "modelward.extraction.defenses.mad:MAD",
    "AdaptiveMisinformation": "modelward.extraction.defenses.adaptive_misinformation:AdaptiveMisinformation",
    "TopOne": "modelward.extraction.defenses.simple:TopOne",
    "Rounding": "modelward.extraction.defenses.simple:Rounding",
    "GaussianNoise": "modelward.extraction.defenses.simple:GaussianNoise",
}
#: config name -> defense class (imported lazily so a defense's heavy dependencies load only when used)
DEFENSES = Registry("defense")
DEFENSES.add("none", "modelward.extraction.defenses.base:NoDefense")
for _name, _cls in (("modelguard_w", "ModelGuardW"), ("modelguard_s", "ModelGuardS"),
                    ("reverse_sigmoid", "ReverseSigmoid"), ("mad", "MAD"),
                    ("adaptive_misinformation", "AdaptiveMisinformation"), ("top1", "TopOne"),
                    ("rounding", "Rounding"), ("gaussian_noise", "GaussianNoise")):
    DEFENSES.add(_name, _CLASSES[_cls])
del _name, _cls

__getattr__, __dir__ = lazy_exports(__name__, _CLASSES)


def defense_class(name: str) -> type[PredictionDefense]:
    """The class registered under ``name``; ConfigError listing the valid names otherwise."""
    return DEFENSES.get(name)


def defense_params(name: str) -> list[str]:
    """The keyword parameters ``make_defense(name, ...)`` accepts."""
    return DEFENSES.parameters(name)


def make_defense(name: str, **params: Any) -> PredictionDefense:
    """Build the defense ``name`` with keyword ``params``.

    Model-dependent defenses take their model as a parameter (``surrogate=`` for MAD, ``misinformation=`` for
    AdaptiveMisinformation).

    Args:
        name: one of ``DEFENSES.names()`` (the table above).
        **params: the defense's keyword parameters.

    Returns:
        The defense; ``defense.defend(probs)`` returns the perturbed probability vectors.

    Raises:
        ConfigError: unknown name or parameter (the message lists the valid ones), or a missing required one.

    Example:
        >>> import torch
        >>> guard = make_defense("rounding", decimals=1)
        >>> guard.defend(torch.tensor([[0.62, 0.27, 0.11]])).sum().item()
        1.0
    """
    try:
        return DEFENSES.create(name, **params)
    except TypeError as e:
        raise ConfigError(f"defense {name!r}: {e}; valid parameters: {defense_params(name)}") from None


class DefenseSpecLike(Protocol):
    """Anything naming a defense and its parameters (``extract``'s ``DefenseSpec``, the guard's ``[defense]``)."""

    name: str
    params: dict[str, Any]


ModelSource = nn.Module | Callable[[], nn.Module]


def build_defense(spec: DefenseSpecLike, models: Mapping[str, ModelSource] | None = None,
                  **overrides: Any) -> PredictionDefense:
    """Build the defense a config section names, supplying the models its class declares in ``needs``.

    Args:
        spec: ``spec.name`` (a registered defense) and ``spec.params`` (its keyword parameters).
        models: for each name in the class's ``needs`` (``"surrogate"``, ``"misinformation"``), a model or a
            zero-argument factory (called only when the defense needs it and ``params`` does not already give it).
        **overrides: parameters that replace ``spec.params`` entries (e.g. ``epsilon=`` of a sweep).

    Returns:
        The defense, as :func:`make_defense` builds it.

    Raises:
        ConfigError: unknown name or parameter, or a needed model that ``models`` does not supply.

    Example:
        >>> from types import SimpleNamespace
        >>> spec = SimpleNamespace(name="mad", params={"epsilon": 0.5})
        >>> d = build_defense(spec, {"surrogate": lambda: nn.Sequential(nn.Flatten(), nn.Linear(4, 3))})
        >>> d.name, d.epsilon
        ('mad', 0.5)
    """
    params = {**spec.params, **overrides}
    for need in defense_class(spec.name).needs:
        if need in params:
            continue
        source = (models or {}).get(need)
        if source is None:
            raise ConfigError(f"defense {spec.name!r}: needs a {need} model ({need}=<nn.Module>); none was given")
        params[need] = source if isinstance(source, nn.Module) else source()
    return make_defense(spec.name, **params)


__all__ = [
    "DEFENSES",
    "IncrementalState",
    "NoDefense",
    "PredictionDefense",
    "as_probs",
    "build_defense",
    "defense_class",
    "defense_params",
    "is_in_simplex",
    "l1_distortion",
    "make_defense",
    "top1_kept",
    *_CLASSES,
]
