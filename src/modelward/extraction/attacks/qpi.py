"""m-QPI (seed 003 §4.3, Table 6): query the whole query set m times and average the m answers.

1-QPI is the Naive attack. Against a deterministic defense the passes agree; against a non-ordered incremental
quantizer later passes can differ, and the mean leaks where an answer flipped.
"""

from __future__ import annotations

import torch

from modelward.extraction.attacks.base import AttackError, AttackStrategy, Context, query_in_batches


class MQPI(AttackStrategy):
    """Average of `m` full passes over the query set (pass by pass, so a stateful defense sees pass order).

    Args:
        m: passes over the query set (the budget is split between them).

    Returns:
        An attack strategy (how the substitute learns from the answers); combine it with a query strategy in
        :class:`ExtractionAttack` or by name with :func:`~modelward.extraction.attacks.make_extraction_attack`.

    Example:
        >>> from modelward.extraction.attacks import make_extraction_attack
        >>> attack = make_extraction_attack("knockoff", "mqpi", strategy_params={"m": 3})
        >>> attack.strategy.m
        3
    """

    name = "mqpi"

    def __init__(self, m: int = 2) -> None:
        if m < 1:
            raise AttackError(f"mqpi: m must be >= 1, got {m}")
        self.m = m
        self.changed = 0  # answers that differ between the first and a later pass (Table 6 "changed")

    def answer(self, ctx: Context, x: torch.Tensor) -> torch.Tensor:
        passes = [query_in_batches(ctx.victim, x, ctx.cfg.query_batch_size) for _ in range(self.m)]
        stack = torch.stack(passes)
        self.changed += int((stack - stack[0]).abs().amax(dim=(0, 2)).gt(1e-6).sum())
        return stack.mean(0)
