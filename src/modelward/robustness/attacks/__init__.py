"""Evasion attacks (seed 004 ch. 2): one class per module, all built on :class:`EvasionAttack`.

``make_attack(name, model, **params)`` builds one by name from :data:`ATTACKS` (a
:class:`~modelward.core.registry.Registry`); ``ATTACK_NAMES`` lists the classic attacks, ``AUTOATTACK_NAMES``
AutoAttack and its members (``ATTACKS.names()``: all valid names). The classes themselves are
exported lazily, torchattacks-style::

    from modelward.robustness.attacks import PGD
    adv = PGD(model, eps=0.1, steps=10)(x, y).x_adv
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from modelward.core.registry import Registry, lazy_exports
from modelward.errors import ConfigError
from modelward.robustness.attacks.base import AttackResult, EvasionAttack, attack_mode, predict

_CLASSES: dict[str, str] = {
    "FGSM": "modelward.robustness.attacks.fgsm:FGSM",
    "BIM": "modelward.robustness.attacks.bim:BIM",
    "ILCM": "modelward.robustness.attacks.ilcm:ILCM",
    "PGD": "modelward.robustness.attacks.pgd:PGD",
    "CarliniWagnerL2": "modelward.robustness.attacks.cw:CarliniWagnerL2",
    "LBFGS": "modelward.robustness.attacks.lbfgs:LBFGS",
    "JSMA": "modelward.robustness.attacks.jsma:JSMA",
    "TransferAttack": "modelward.robustness.attacks.transfer:TransferAttack",
    "APGD": "modelward.robustness.attacks.apgd:APGD",
    "APGDT": "modelward.robustness.attacks.apgdt:APGDT",
    "FAB": "modelward.robustness.attacks.fab:FAB",
    "Square": "modelward.robustness.attacks.square:Square",
    "AutoAttack": "modelward.robustness.attacks.autoattack:AutoAttack",
}
#: config name -> attack class (imported on first use)
ATTACKS = Registry("attack")
ATTACK_NAMES: tuple[str, ...] = ("fgsm", "bim", "ilcm", "pgd", "cw", "lbfgs", "jsma", "transfer")
#: AutoAttack (Croce & Hein 2020) and its members, registered beside the classic attacks of ATTACK_NAMES
AUTOATTACK_NAMES: tuple[str, ...] = ("apgd", "apgdt", "fab", "square", "autoattack")
for _name, _target in zip(ATTACK_NAMES + AUTOATTACK_NAMES, _CLASSES.values(), strict=True):
    ATTACKS.add(_name, _target)
del _name, _target

#: attacks beside AutoAttack's members that are not part of any standard suite
_EXTRA: dict[str, tuple[str, str]] = {
    # the Square Attack with windows reaching every pixel: stronger than the reference AutoAttack runs (issue 38)
    "square_full": ("SquareFull", "modelward.robustness.attacks.square_full:SquareFull"),
}
for _name, (_cls, _target) in _EXTRA.items():
    ATTACKS.add(_name, _target)
    _CLASSES[_cls] = _target
del _name, _cls, _target

__getattr__, __dir__ = lazy_exports(__name__, _CLASSES)


def attack_class(name: str) -> type[EvasionAttack]:
    """The class registered under ``name`` (case-insensitive); ConfigError listing the valid names otherwise."""
    return ATTACKS.get(name.lower())


def attack_params(name: str) -> list[str]:
    """Keyword parameters the attack accepts (besides the model)."""
    return [p for p in ATTACKS.parameters(name.lower()) if p != "model"]


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
    """Build evasion attack ``name`` on ``model``.

    Args:
        name: one of :data:`ATTACK_NAMES` (case-insensitive).
        model: the classifier under attack (returns logits).
        **params: the attack class's keyword parameters (``eps``, ``steps``, ``norm``, ...).

    Returns:
        The attack; call it as ``attack(x, y)`` for an :class:`AttackResult`.

    Raises:
        ConfigError: unknown name, or a parameter the attack does not take (the message lists the valid ones).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
        >>> res = make_attack("fgsm", model, eps=0.1)(torch.rand(5, 4), torch.tensor([0, 1, 2, 0, 1]))
        >>> res.x_adv.shape
        torch.Size([5, 4])
    """
    if "clip" in params and params["clip"] is not None:
        params["clip"] = tuple(params["clip"])
    return ATTACKS.create(name.lower(), model, **params)


__all__ = ["ATTACKS", "ATTACK_NAMES", "AUTOATTACK_NAMES", "AttackResult", "EvasionAttack", "ThreatModel", "attack_class",
           "attack_mode", "attack_params", "make_attack", "predict", "threat_model", *_CLASSES]
