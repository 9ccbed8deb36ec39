"""Top-1 attack (seed 003 §4.1): train on the one-hot argmax of each answer.

Against any deterministic top-1-preserving defense this equals the undefended Top-1 result (digest §6.2).
"""

from __future__ import annotations

import torch

from modelward.extraction.attacks.base import AttackStrategy, Context, one_hot_top1


class Top1(AttackStrategy):
    """Hard-label attacker: Ỹ = onehot(argmax Ŷ).

    Args:
        (none)

    Returns:
        An attack strategy (how the substitute learns from the answers); combine it with a query strategy in
        :class:`ExtractionAttack` or by name with :func:`~modelward.extraction.attacks.make_extraction_attack`.

    Example:
        >>> from modelward.extraction.attacks import make_extraction_attack
        >>> attack = make_extraction_attack("knockoff", "top1")
        >>> attack.strategy.name
        'top1'
    """

    name = "top1"

    def recover(self, ctx: Context, x: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
        return one_hot_top1(answers)
