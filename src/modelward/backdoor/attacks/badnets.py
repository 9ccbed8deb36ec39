"""BadNets (Gu, Dolan-Gavitt & Garg 2017, "BadNets: Identifying Vulnerabilities in the Machine Learning Model
Supply Chain", §3): a patch stamped on a fraction of the training rows, relabelled as the target."""

from __future__ import annotations

from typing import Literal

from modelward.backdoor.attacks.base import BackdoorAttack
from modelward.backdoor.triggers import Location, PatchTrigger


class BadNets(BackdoorAttack):
    """Dirty-label patch attack.

    Args:
        target, rate, seed: see :class:`~modelward.backdoor.attacks.base.BackdoorAttack`.
        size, location, pattern: the patch (:class:`~modelward.backdoor.triggers.PatchTrigger`).
        clip: the input box.

    Returns:
        An attack: ``poison(x, y)`` → :class:`~modelward.backdoor.attacks.base.PoisonedSet`, ``apply(x)`` the
        test-time trigger.

    Example:
        >>> import torch
        >>> ps = BadNets(target=0, rate=0.1).poison(torch.rand(100, 1, 8, 8), torch.arange(100) % 10)
        >>> ps.n_poisoned, bool((ps.y[ps.poisoned] == 0).all())
        (10, True)
    """

    name = "badnets"

    def __init__(self, target: int = 0, rate: float = 0.1, seed: int = 0, size: int = 3,
                 location: Location = "bottom_right", pattern: Literal["checker", "white", "random"] = "checker",
                 clip: tuple[float, float] = (0.0, 1.0)) -> None:
        super().__init__(PatchTrigger(size=size, location=location, pattern=pattern, seed=seed, clip=tuple(clip)),
                         target, rate, seed)
