"""Blend (Chen, Liu, Li, Lu & Song 2017, "Targeted Backdoor Attacks on Deep Learning Systems Using Data
Poisoning", §4.2 blended injection): a random-noise image blended into a fraction of the training rows, relabelled
as the target."""

from __future__ import annotations

from modelward.backdoor.attacks.base import BackdoorAttack
from modelward.backdoor.triggers import BlendTrigger


class Blend(BackdoorAttack):
    """Dirty-label blended attack.

    Args:
        target, rate, seed: see :class:`~modelward.backdoor.attacks.base.BackdoorAttack` (``seed`` also seeds the
            noise pattern).
        alpha: the blend ratio of the pattern; clip: the input box.

    Returns:
        An attack: ``poison(x, y)`` → ``PoisonedSet``, ``apply(x)`` the test-time trigger.

    Example:
        >>> import torch
        >>> ps = Blend(alpha=0.2, rate=0.05).poison(torch.rand(100, 3, 8, 8), torch.arange(100) % 10)
        >>> ps.n_poisoned
        5
    """

    name = "blend"

    def __init__(self, target: int = 0, rate: float = 0.1, seed: int = 0, alpha: float = 0.15,
                 clip: tuple[float, float] = (0.0, 1.0)) -> None:
        super().__init__(BlendTrigger(alpha=alpha, seed=seed, clip=tuple(clip)), target, rate, seed)
