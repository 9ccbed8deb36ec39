"""Naive attack (seed 003 §4.1): no recovery, soft-label CE on the returned predictions Ŷ (r = identity)."""

from __future__ import annotations

from modelward.extraction.attacks.base import AttackStrategy


class Naive(AttackStrategy):
    """Train on the answers as they are: the non-adaptive attacker of Remark 1.

    Args:
        (none)

    Returns:
        An attack strategy (how the substitute learns from the answers); combine it with a query strategy in
        :class:`ExtractionAttack` or by name with :func:`~modelward.extraction.attacks.make_extraction_attack`.

    Example:
        >>> from modelward.extraction.attacks import make_extraction_attack
        >>> attack = make_extraction_attack("knockoff", "naive")
        >>> attack.strategy.needs_knowledge
        False
    """

    name = "naive"
