"""Naive attack (seed 003 §4.1): no recovery, soft-label CE on the returned predictions Ŷ (r = identity)."""

from __future__ import annotations

from modelward.extraction.attacks.base import AttackStrategy


class Naive(AttackStrategy):
    """Train on the answers as they are: the non-adaptive attacker of Remark 1."""

    name = "naive"
