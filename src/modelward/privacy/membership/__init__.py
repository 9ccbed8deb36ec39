"""Membership-inference attacks (seed 002 §8.2–8.3, App. C; LiRA; RMIA): one module per attack.

``ATTACKS`` maps a config name to its class; :func:`make_attack` builds one from TOML parameters (unknown names or
parameters are :class:`~modelward.errors.ConfigError` naming the valid choices).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from modelward.errors import ConfigError
from modelward.privacy.membership.base import AttackData, MembershipAttack, MembershipResult

ATTACKS: dict[str, str] = {
    "naive": "modelward.privacy.membership.naive:NaiveAttack",
    "loss": "modelward.privacy.membership.loss:LossAttack",
    "shadow": "modelward.privacy.membership.shadow:ShadowAttack",
    "bayesian_wb": "modelward.privacy.membership.bayesian_wb:BayesianWB",
    "nn_wb": "modelward.privacy.membership.nn_wb:NNWB",
    "deep_wb": "modelward.privacy.membership.deep_wb:DeepWB",
    "lira": "modelward.privacy.membership.lira:LiRA",
    "rmia": "modelward.privacy.membership.rmia:RMIA",
}
# attacks whose fit needs a shadow pool / the training algorithm A
NEEDS_SHADOWS = {"shadow", "lira", "rmia"}
NEEDS_TRAINER = {"bayesian_wb", "nn_wb", "deep_wb"}


def attack_class(name: str) -> type[MembershipAttack]:
    if name not in ATTACKS:
        raise ConfigError(f"unknown membership attack {name!r}; valid choices: {sorted(ATTACKS)}")
    mod, attr = ATTACKS[name].split(":")
    return getattr(importlib.import_module(mod), attr)


def make_attack(name: str, calibrate: float | None = None, **params: Any) -> MembershipAttack:
    """Build attack ``name`` with ``params``; ``calibrate=α`` wraps it in App. C's hold-out calibration."""
    cls = attack_class(name)
    valid = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise ConfigError(f"attack {name!r}: unknown parameter(s) {unknown}; valid: {valid or 'none'}")
    attack = cls(**params)
    if calibrate is not None:
        from modelward.privacy.membership.calibration import Calibrated

        return Calibrated(attack, calibrate)
    return attack


__all__ = ["ATTACKS", "AttackData", "MembershipAttack", "MembershipResult", "attack_class", "make_attack"]
