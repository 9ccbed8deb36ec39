"""Common base of the membership-inference attacks (seed 002 §8.1, Def. 8.1; Threat Model 8.1).

An attack is fitted once on what the attacker knows (:class:`AttackData`: the target, auxiliary hold-out data from
D* disjoint from S, optionally the training algorithm A and a shared :class:`~modelward.privacy.shadows.ShadowPool`)
and then scores any (x, y): **higher score = more likely a member**. ``decide`` thresholds the scores at the
attack's own threshold (the thesis' ½ on a membership probability, i.e. 0 on its log-odds), or at a calibrated one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from modelward.errors import ConfigError
from modelward.privacy.shadows import ModelTrainer, ShadowPool


@dataclass
class AttackData:
    """The attacker's knowledge (Threat Model 8.1): target model, hold-out data, algorithm A, shadow models.

    ``cache`` lets attacks share expensive artefacts in one audit (e.g. bayesian-wb and nn-wb the same proxies).

    Args:
        target: the attacked model (returns logits).
        x_aux: the attacker's hold-out inputs from D*, disjoint from the target's training set.
        y_aux: their labels.
        num_classes: number of classes of the target.
        trainer: the training algorithm A (needed by attacks that train proxies, e.g. bayesian_wb).
        shadows: a shared :class:`~modelward.privacy.shadows.ShadowPool` (needed by shadow / lira / rmia).
        seed: seeds the attacks' random choices.
        cache: artefacts shared between attacks of one audit.

    Returns:
        A dataclass passed to :meth:`MembershipAttack.fit`; ``need_trainer(who)`` / ``need_shadows(who)`` return
        the trainer / pool or raise :class:`~modelward.errors.ConfigError` naming the attack.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> data = AttackData(nn.Linear(4, 2), torch.randn(10, 4), torch.randint(2, (10,)), num_classes=2)
        >>> data.shadows is None and data.seed
        0
    """

    target: nn.Module
    x_aux: torch.Tensor
    y_aux: torch.Tensor
    num_classes: int
    trainer: ModelTrainer | None = None
    shadows: ShadowPool | None = None
    seed: int = 0
    cache: dict[str, Any] = field(default_factory=dict)

    def need_trainer(self, who: str) -> ModelTrainer:
        if self.trainer is None:
            raise ConfigError(f"attack {who!r} needs the training algorithm A (AttackData.trainer)")
        return self.trainer

    def need_shadows(self, who: str) -> ShadowPool:
        if self.shadows is None:
            raise ConfigError(f"attack {who!r} needs a shadow pool (AttackData.shadows; see ShadowPool.train)")
        return self.shadows


@dataclass(frozen=True)
class MembershipResult:
    scores: np.ndarray
    decisions: np.ndarray
    threshold: float


class MembershipAttack:
    """Base class: ``fit(data)`` then ``score(x, y)`` (higher = member) and ``decide(x, y)``.

    Subclasses set ``name`` and ``threshold`` (the decision threshold on their score scale) and implement
    :meth:`score`; :meth:`fit` is optional.

    Args:
        (none here) subclasses take their own parameters; ``fit(data)`` takes an :class:`AttackData`;
        ``score`` / ``decide`` / ``run`` take inputs ``x`` and labels ``y`` (and optionally a ``threshold``
        overriding ``self.threshold``).

    Returns:
        ``fit`` returns the attack itself; ``score`` a float array (higher = more likely a member); ``decide`` the
        bool array ``score > threshold``; ``run`` a :class:`MembershipResult` (scores, decisions, threshold).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from modelward.privacy import make_membership_attack
        >>> x, y = torch.randn(20, 4), torch.randint(2, (20,))
        >>> attack = make_membership_attack("loss").fit(AttackData(nn.Linear(4, 2), x, y, num_classes=2))
        >>> isinstance(attack, MembershipAttack), attack.decide(x[:5], y[:5]).shape
        (True, (5,))
    """

    name: str = "base"
    threshold: float = 0.0

    def fit(self, data: AttackData) -> MembershipAttack:
        self.data = data
        return self

    def score(self, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def decide(self, x: torch.Tensor, y: torch.Tensor, threshold: float | None = None) -> np.ndarray:
        return self.score(x, y) > (self.threshold if threshold is None else threshold)

    def run(self, x: torch.Tensor, y: torch.Tensor, threshold: float | None = None) -> MembershipResult:
        s = self.score(x, y)
        t = self.threshold if threshold is None else threshold
        return MembershipResult(s, s > t, t)


def log_sigmoid_odds(p: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    p = np.clip(p, eps, 1 - eps)
    return np.log(p) - np.log1p(-p)
