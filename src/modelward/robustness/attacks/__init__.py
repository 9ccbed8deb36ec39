"""Evasion attacks (seed 004 ch. 2): one class per module, all built on :class:`EvasionAttack`.

``make_attack(name, model, **params)`` builds one by name; ``ATTACK_NAMES`` lists the valid names.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any

from torch import nn

from modelward.errors import ConfigError
from modelward.robustness.attacks.base import AttackResult, EvasionAttack, attack_mode, predict

_REGISTRY: dict[str, str] = {
    "fgsm": "modelward.robustness.attacks.fgsm:FGSM",
    "bim": "modelward.robustness.attacks.bim:BIM",
    "ilcm": "modelward.robustness.attacks.ilcm:ILCM",
    "pgd": "modelward.robustness.attacks.pgd:PGD",
    "cw": "modelward.robustness.attacks.cw:CarliniWagnerL2",
    "lbfgs": "modelward.robustness.attacks.lbfgs:LBFGS",
    "jsma": "modelward.robustness.attacks.jsma:JSMA",
    "transfer": "modelward.robustness.attacks.transfer:TransferAttack",
}
ATTACK_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def attack_class(name: str) -> type[EvasionAttack]:
    """The class registered under ``name``; ConfigError listing the valid names otherwise."""
    key = name.lower()
    if key not in _REGISTRY:
        raise ConfigError(f"unknown attack {name!r}; valid attacks: {', '.join(ATTACK_NAMES)}")
    mod, cls = _REGISTRY[key].split(":")
    return getattr(importlib.import_module(mod), cls)


def attack_params(name: str) -> list[str]:
    """Keyword parameters the attack accepts (besides the model)."""
    sig = inspect.signature(attack_class(name).__init__)
    return [p for p in sig.parameters if p not in ("self", "model")]


@dataclass(frozen=True)
class ThreatModel:
    """What an attack's result means: the norm of its perturbations and whether it searches an ε-ball."""

    norm: str  # "linf" | "l2" | "l0"
    takes_eps: bool


def threat_model(name: str, params: dict[str, Any] | None = None) -> ThreatModel:
    """The threat model of attack ``name`` built with ``params`` (its ``norm`` if it has one, else its own).

    ε-ball attacks (FGSM, BIM, ILCM, PGD, transfer) take ε; minimum-norm attacks (C&W and L-BFGS in ℓ2, JSMA in ℓ0
    with its own feature budget ``gamma``) do not, so an ε sweep must not treat them as ε-attacks.
    """
    cls = attack_class(name)
    norm = cls.default_norm
    if params and "norm" in params:
        norm = params["norm"]
        if "norm" not in attack_params(name) or norm not in cls.norms:
            raise ConfigError(f"attack {name!r}: norm {norm!r} is not available; it attacks in "
                              f"{', '.join(cls.norms)}")
    return ThreatModel(str(norm), bool(cls.takes_eps))


def make_attack(name: str, model: nn.Module, **params: Any) -> EvasionAttack:
    """Build attack ``name`` on ``model``; unknown parameters raise ConfigError naming the valid ones."""
    cls = attack_class(name)
    valid = attack_params(name)
    bad = sorted(set(params) - set(valid))
    if bad:
        raise ConfigError(f"attack {name!r}: unknown parameter(s) {bad}; valid: {', '.join(valid)}")
    if "clip" in params and params["clip"] is not None:
        params["clip"] = tuple(params["clip"])
    return cls(model, **params)


__all__ = ["ATTACK_NAMES", "AttackResult", "EvasionAttack", "ThreatModel", "attack_class", "attack_mode",
           "attack_params", "make_attack", "predict", "threat_model"]
