"""Smoothing attack (Lee et al.; seed 003 §4.1, App. B.1): for each query image, ask n = 3 augmented versions and
average their (perturbed) answers. Augmentation as in App. B.1 and the official code: random crop with padding
(pad = side/8, i.e. 4 px at 32 px) + random horizontal flip; the main text's "random affine" is not used.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from modelward.extraction.attacks.base import AttackError, AttackStrategy, Context, query_in_batches


def crop_flip(x: torch.Tensor, pad: int, flip: bool, g: torch.Generator) -> torch.Tensor:
    """RandomCrop(side, padding=pad) + RandomHorizontalFlip on a batch (N, C, H, W), seeded."""
    n, _, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad))
    oy = torch.randint(0, 2 * pad + 1, (n,), generator=g)
    ox = torch.randint(0, 2 * pad + 1, (n,), generator=g)
    out = torch.stack([padded[i, :, oy[i] : oy[i] + h, ox[i] : ox[i] + w] for i in range(n)])
    if flip:
        mask = torch.rand(n, generator=g) < 0.5
        out[mask] = out[mask].flip(-1)
    return out


class Smoothing(AttackStrategy):
    """Answer for x = mean of the answers for `n` random crop+flip copies of x (train on the original x).

    Args:
        n: crop+flip copies queried per input (each costs one query of the budget).
        pad: crop padding in pixels (default: an eighth of the image side).
        flip: also flip copies horizontally.

    Returns:
        An attack strategy (how the substitute learns from the answers); combine it with a query strategy in
        :class:`ExtractionAttack` or by name with :func:`~modelward.extraction.attacks.make_extraction_attack`.

    Example:
        >>> from modelward.extraction.attacks import make_extraction_attack
        >>> attack = make_extraction_attack("knockoff", "smoothing", strategy_params={"n": 2})
        >>> attack.strategy.n
        2
    """

    name = "smoothing"

    def __init__(self, n: int = 3, pad: int | None = None, flip: bool = True) -> None:
        if n < 1:
            raise AttackError(f"smoothing: n must be >= 1, got {n}")
        self.n, self.pad, self.flip = n, pad, flip

    def answer(self, ctx: Context, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4:
            raise AttackError(f"smoothing: needs image inputs (N, C, H, W), got shape {tuple(x.shape)}")
        pad = self.pad if self.pad is not None else max(1, x.shape[-1] // 8)
        outs = [query_in_batches(ctx.victim, crop_flip(x, pad, self.flip, ctx.generator), ctx.cfg.query_batch_size)
                for _ in range(self.n)]
        return torch.stack(outs).mean(0)
