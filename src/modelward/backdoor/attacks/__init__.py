"""Backdoor attacks, for self-tests and for calibrating detectors: one class per module on
:class:`~modelward.backdoor.attacks.base.BackdoorAttack`.

``make_backdoor_attack(name, **params)`` builds one by name from :data:`ATTACKS`::

    from modelward.backdoor.attacks import make_backdoor_attack
    attack = make_backdoor_attack("badnets", target=0, rate=0.1)
    poisoned = attack.poison(x_train, y_train)      # PoisonedSet: x, y, poisoned, cover, target
"""

from __future__ import annotations

from typing import Any

from modelward.core.registry import Registry, lazy_exports

_CLASSES = {
    "BadNets": "modelward.backdoor.attacks.badnets:BadNets",
    "Blend": "modelward.backdoor.attacks.blend:Blend",
    "WaNet": "modelward.backdoor.attacks.wanet:WaNet",
    "CleanLabel": "modelward.backdoor.attacks.clean_label:CleanLabel",
}
#: config name -> attack class
ATTACKS = Registry("backdoor attack")
for _name, _target in zip(("badnets", "blend", "wanet", "clean_label"), _CLASSES.values(), strict=True):
    ATTACKS.add(_name, _target)
del _name, _target

__getattr__, __dir__ = lazy_exports(__name__, _CLASSES)


def make_backdoor_attack(name: str, **params: Any) -> Any:
    """The attack registered under ``name`` built with ``params`` (ConfigError naming the valid names/params).

    Example:
        >>> make_backdoor_attack("blend", alpha=0.2).trigger.alpha
        0.2
    """
    return ATTACKS.create(name, **params)
