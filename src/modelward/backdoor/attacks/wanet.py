"""WaNet (Nguyen & Tran, ICLR 2021, "WaNet – Imperceptible Warping-based Backdoor Attack", §3.2–3.3): a fixed
smooth warping field applied to a fraction of the training rows, relabelled as the target, plus "noise mode" rows
warped by the field with random noise added and *keeping* their labels, so that the model learns the exact field
rather than warping in general."""

from __future__ import annotations

import torch

from modelward.backdoor.attacks.base import BackdoorAttack
from modelward.backdoor.triggers import WarpTrigger


class WaNet(BackdoorAttack):
    """Dirty-label warping attack with noise mode.

    Args:
        target, rate, seed: see :class:`~modelward.backdoor.attacks.base.BackdoorAttack` (``seed`` also seeds the
            field).
        grid, strength: k and s of the field (:class:`~modelward.backdoor.triggers.WarpTrigger`).
        cross_ratio: noise-mode rows per poisoned row (ρ_n / ρ_a; 2 in the paper).
        clip: the input box.

    Returns:
        An attack: ``poison(x, y)`` → ``PoisonedSet`` (noise-mode rows in ``cover``), ``apply(x)`` the warp.

    Example:
        >>> import torch
        >>> ps = WaNet(rate=0.1, cross_ratio=2).poison(torch.rand(100, 1, 8, 8), torch.arange(100) % 10)
        >>> ps.n_poisoned, int(ps.cover.sum())
        (10, 20)
    """

    name = "wanet"

    def __init__(self, target: int = 0, rate: float = 0.1, seed: int = 0, grid: int = 4, strength: float = 1.0,
                 cross_ratio: float = 2.0, clip: tuple[float, float] = (0.0, 1.0)) -> None:
        super().__init__(WarpTrigger(grid=grid, strength=strength, seed=seed, clip=tuple(clip)), target, rate, seed)
        self.cross_ratio = float(cross_ratio)

    def describe(self) -> dict:
        return {**super().describe(), "cross_ratio": self.cross_ratio}

    def _cover(self, x: torch.Tensor, y: torch.Tensor, poisoned: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        free = (~poisoned).nonzero().flatten()
        k = min(len(free), int(round(self.cross_ratio * self.rate * len(y))))
        cover = torch.zeros(len(y), dtype=torch.bool)
        if k == 0:
            return cover
        idx = free[torch.randperm(len(free), generator=g)[:k]]
        assert isinstance(self.trigger, WarpTrigger)
        grids = self.trigger.noisy(k, x.shape[-2], x.shape[-1], g)
        x[idx] = torch.nn.functional.grid_sample(x[idx], grids.to(x), align_corners=True).clamp(*self.trigger.clip)
        cover[idx] = True
        return cover
