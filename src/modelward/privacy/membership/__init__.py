"""Membership-inference attacks (seed 002 §8.2–8.3, App. C; LiRA; RMIA; label-only boundary distance and
augmentation, which query a top-1 API only): one module per attack.

``ATTACKS`` maps a config name to its class; :func:`make_membership_attack` builds one from TOML parameters
(unknown names or parameters are :class:`~modelward.errors.ConfigError` naming the valid choices).
"""

from __future__ import annotations

from typing import Any

from modelward.core.registry import Registry
from modelward.privacy.membership.base import AttackData, MembershipAttack, MembershipResult
from modelward.privacy.membership.calibration import Calibrated

ATTACKS = Registry("membership attack")
for _name, _target in {
    "naive": "modelward.privacy.membership.naive:NaiveAttack",
    "loss": "modelward.privacy.membership.loss:LossAttack",
    "shadow": "modelward.privacy.membership.shadow:ShadowAttack",
    "bayesian_wb": "modelward.privacy.membership.bayesian_wb:BayesianWB",
    "nn_wb": "modelward.privacy.membership.nn_wb:NNWB",
    "deep_wb": "modelward.privacy.membership.deep_wb:DeepWB",
    "lira": "modelward.privacy.membership.lira:LiRA",
    "rmia": "modelward.privacy.membership.rmia:RMIA",
    "boundary": "modelward.privacy.membership.label_only:BoundaryDistanceAttack",
    "augmentation": "modelward.privacy.membership.label_only:AugmentationAttack",
}.items():
    ATTACKS.add(_name, _target)
# attacks whose fit needs a shadow pool / the training algorithm A
NEEDS_SHADOWS = {"shadow", "lira", "rmia"}
NEEDS_TRAINER = {"bayesian_wb", "nn_wb", "deep_wb"}


def attack_class(name: str) -> type[MembershipAttack]:
    return ATTACKS.get(name)


def make_membership_attack(name: str, calibrate: float | None = None, **params: Any) -> MembershipAttack:
    """Build attack ``name`` with ``params``; ``calibrate=α`` wraps it in App. C's hold-out calibration.

    Args:
        name: a key of ``ATTACKS`` (naive, loss, shadow, bayesian_wb, nn_wb, deep_wb, lira, rmia, boundary,
            augmentation);
            an unknown name raises :class:`~modelward.errors.ConfigError` naming the valid ones.
        calibrate: the calibration level α (None: no calibration).
        **params: the attack's constructor parameters (unknown ones raise ``ConfigError``).

    Returns:
        An unfitted :class:`~modelward.privacy.membership.base.MembershipAttack` (wrapped in ``Calibrated`` when
        ``calibrate`` is given).

    Example:
        >>> make_membership_attack("loss", tau=0.05).name
        'loss'
    """
    attack = ATTACKS.create(name, **params)
    if calibrate is not None:
        return Calibrated(attack, calibrate)
    return attack


__all__ = ["ATTACKS", "AttackData", "MembershipAttack", "MembershipResult", "attack_class", "make_membership_attack"]
