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

Example: ``make_defense("mad", epsilon=1.0, surrogate=build_model(cfg, shape, k))``.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from modelward.errors import ConfigError
from modelward.extraction.defenses.base import (
    NoDefense,
    PredictionDefense,
    as_probs,
    is_in_simplex,
    l1_distortion,
    top1_kept,
)

# name -> "module:Class" (imported lazily so a defense's heavy dependencies load only when used)
DEFENSES: dict[str, str] = {
    "none": "modelward.extraction.defenses.base:NoDefense",
    "modelguard_w": "modelward.extraction.defenses.modelguard_w:ModelGuardW",
    "modelguard_s": "modelward.extraction.defenses.modelguard_s:ModelGuardS",
    "reverse_sigmoid": "modelward.extraction.defenses.reverse_sigmoid:ReverseSigmoid",
    "mad": "modelward.extraction.defenses.mad:MAD",
    "adaptive_misinformation": "modelward.extraction.defenses.adaptive_misinformation:AdaptiveMisinformation",
    "top1": "modelward.extraction.defenses.simple:TopOne",
    "rounding": "modelward.extraction.defenses.simple:Rounding",
    "gaussian_noise": "modelward.extraction.defenses.simple:GaussianNoise",
}


def defense_class(name: str) -> type[PredictionDefense]:
    """The class registered under ``name``; ConfigError listing the valid names otherwise."""
    if name not in DEFENSES:
        raise ConfigError(f"defense.name {name!r} is not a known defense; valid choices: {sorted(DEFENSES)}")
    mod, cls = DEFENSES[name].split(":")
    return getattr(importlib.import_module(mod), cls)


def defense_params(name: str) -> list[str]:
    """The keyword parameters ``make_defense(name, ...)`` accepts."""
    sig = inspect.signature(defense_class(name).__init__)
    return [p for p in sig.parameters if p != "self" and sig.parameters[p].kind is inspect.Parameter.KEYWORD_ONLY
            or (p != "self" and sig.parameters[p].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)]


def make_defense(name: str, **params: Any) -> PredictionDefense:
    """Build the defense ``name`` with keyword ``params``; unknown names/params raise ConfigError listing the valid
    ones. Model-dependent defenses take their model as a parameter (``surrogate=`` for MAD, ``misinformation=`` for
    AdaptiveMisinformation)."""
    cls = defense_class(name)
    valid = defense_params(name)
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise ConfigError(f"defense {name!r}: unknown parameter(s) {unknown}; valid parameters: {valid or 'none'}")
    try:
        return cls(**params)
    except TypeError as e:
        raise ConfigError(f"defense {name!r}: {e}; valid parameters: {valid}") from None


__all__ = [
    "DEFENSES",
    "NoDefense",
    "PredictionDefense",
    "as_probs",
    "defense_class",
    "defense_params",
    "is_in_simplex",
    "l1_distortion",
    "make_defense",
    "top1_kept",
]
