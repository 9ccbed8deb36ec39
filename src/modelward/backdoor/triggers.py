"""Backdoor triggers: a function from clean images to triggered images, the same for every row.

- :class:`PatchTrigger` — BadNets (Gu, Dolan-Gavitt & Garg 2017): a small square stamped over the image,
  ``x' = (1 − m)·x + m·p`` with a 0/1 mask ``m`` and a pattern ``p``.
- :class:`BlendTrigger` — Blend (Chen et al. 2017, "Targeted backdoor attacks ... using data poisoning", §4.2):
  a full-image pattern mixed in, ``x' = (1 − α)·x + α·p``.
- :class:`WarpTrigger` — WaNet (Nguyen & Tran, ICLR 2021, §3.2): a smooth, fixed warping field, ``x' = W(x, M)``
  with ``M = identity + s·P/h``, ``P`` a random k×k field of U(−1, 1) values normalised by its mean absolute value
  and upsampled bicubically to the image (eq. 4–5); :meth:`WarpTrigger.noisy` is the paper's "noise mode" field
  (the trigger's field plus a random one, eq. 6), used to keep the labels of some rows.

Every trigger is seeded (its pattern or field is drawn from a ``torch.Generator``), acts on ``N×C×H×W`` batches,
keeps the values inside ``clip`` and serialises to a dict (:meth:`Trigger.to_dict`).

Example:
    >>> import torch
    >>> t = PatchTrigger(size=2, location="bottom_right", pattern="white")
    >>> y = t.apply(torch.zeros(1, 1, 4, 4))
    >>> y[0, 0].tolist()
    [[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]]
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F

from modelward.errors import ConfigError

Location = Literal["bottom_right", "bottom_left", "top_right", "top_left", "center"]


class Trigger(ABC):
    """A trigger: :meth:`apply` maps a batch of clean images to triggered ones."""

    kind: ClassVar[str]
    clip: tuple[float, float]

    @abstractmethod
    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """The triggered batch (same shape, inside ``clip``)."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)  # type: ignore[call-overload]
        d["kind"] = self.kind
        return d


def _check_image(x: torch.Tensor) -> None:
    if x.dim() != 4:
        raise ConfigError(f"backdoor triggers act on images (N×C×H×W); got a tensor of shape {tuple(x.shape)}")


@dataclass(frozen=True)
class PatchTrigger(Trigger):
    """BadNets' patch: a ``size``×``size`` square at ``location``.

    Args:
        size: side of the square in pixels (clipped to the image).
        location: where the square sits.
        pattern: ``"checker"`` (alternating clip bounds, the classic BadNets pattern), ``"white"`` (the upper
            bound) or ``"random"`` (U(clip), seeded).
        amplitude: 1 stamps the pattern; below 1 the patch is blended (a less visible patch, Turner et al.'s
            reduced-amplitude trigger for clean-label attacks).
        seed: seeds the random pattern.
        clip: the input box.
    """

    kind: ClassVar[str] = "patch"
    size: int = 3
    location: Location = "bottom_right"
    pattern: Literal["checker", "white", "random"] = "checker"
    amplitude: float = 1.0
    seed: int = 0
    clip: tuple[float, float] = (0.0, 1.0)

    def mask_and_pattern(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """The mask ``1×H×W`` (0/1 scaled by ``amplitude``) and the pattern ``C×H×W`` for images of ``shape``."""
        c, h, w = shape[-3:]
        s = max(1, min(self.size, h, w))
        r0 = {"bottom_right": h - s, "bottom_left": h - s, "top_right": 0, "top_left": 0, "center": (h - s) // 2}
        c0 = {"bottom_right": w - s, "bottom_left": 0, "top_right": w - s, "top_left": 0, "center": (w - s) // 2}
        mask = torch.zeros(1, h, w)
        mask[:, r0[self.location]:r0[self.location] + s, c0[self.location]:c0[self.location] + s] = self.amplitude
        lo, hi = self.clip
        if self.pattern == "white":
            pat = torch.full((c, h, w), hi)
        elif self.pattern == "checker":
            ii, jj = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
            pat = torch.where((ii + jj) % 2 == 0, hi, lo).float().expand(c, h, w).clone()
        else:
            g = torch.Generator().manual_seed(self.seed)
            pat = lo + (hi - lo) * torch.rand(c, h, w, generator=g)
        return mask, pat

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        _check_image(x)
        m, p = self.mask_and_pattern(tuple(x.shape))
        m, p = m.to(x), p.to(x)
        return ((1 - m) * x + m * p).clamp(*self.clip)


@dataclass(frozen=True)
class BlendTrigger(Trigger):
    """Blend: a seeded uniform-noise image mixed in with weight ``alpha`` (Chen et al. 2017's random pattern).

    Args:
        alpha: the blend ratio (0.1–0.2 in the literature: visible as a faint texture).
        seed: seeds the pattern; clip: the input box.
    """

    kind: ClassVar[str] = "blend"
    alpha: float = 0.15
    seed: int = 0
    clip: tuple[float, float] = (0.0, 1.0)

    def pattern_for(self, shape: tuple[int, ...]) -> torch.Tensor:
        c, h, w = shape[-3:]
        g = torch.Generator().manual_seed(self.seed)
        lo, hi = self.clip
        return lo + (hi - lo) * torch.rand(c, h, w, generator=g)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        _check_image(x)
        p = self.pattern_for(tuple(x.shape)).to(x)
        return ((1 - self.alpha) * x + self.alpha * p).clamp(*self.clip)


@dataclass(frozen=True)
class WarpTrigger(Trigger):
    """WaNet's warping trigger (Nguyen & Tran 2021, eq. 4–5).

    Args:
        grid: k, the side of the random control field (4 in the paper).
        strength: s, the warping strength (0.5 in the paper at 32×32; small images need more to be learnable).
        seed: seeds the field; clip: the input box.
    """

    kind: ClassVar[str] = "warp"
    grid: int = 4
    strength: float = 1.0
    seed: int = 0
    clip: tuple[float, float] = (0.0, 1.0)
    _cache: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "grid": self.grid, "strength": self.strength, "seed": self.seed,
                "clip": self.clip}

    def field_for(self, h: int, w: int) -> torch.Tensor:
        """The warping grid ``1×H×W×2`` (``grid_sample`` coordinates in [−1, 1])."""
        if (h, w) not in self._cache:
            g = torch.Generator().manual_seed(self.seed)
            ins = torch.rand(1, 2, self.grid, self.grid, generator=g) * 2 - 1
            ins = ins / ins.abs().mean()  # eq. 4: normalised by the mean absolute value
            noise = F.interpolate(ins, size=(h, w), mode="bicubic", align_corners=True).permute(0, 2, 3, 1)
            self._cache[(h, w)] = (_identity(h, w) + self.strength * noise / h).clamp(-1, 1)
        return self._cache[(h, w)]

    def noisy(self, n: int, h: int, w: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` noise-mode grids: the trigger's field plus U(−1, 1)/h noise per row (eq. 6)."""
        base = self.field_for(h, w)
        noise = (torch.rand(n, h, w, 2, generator=generator) * 2 - 1) / h
        return (base + noise).clamp(-1, 1)

    def warp(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        grid = grid.to(x).expand(len(x), -1, -1, -1)
        return F.grid_sample(x, grid, align_corners=True).clamp(*self.clip)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        _check_image(x)
        return self.warp(x, self.field_for(x.shape[-2], x.shape[-1]))


def _identity(h: int, w: int) -> torch.Tensor:
    ys = torch.linspace(-1, 1, h)
    xs = torch.linspace(-1, 1, w)
    yy, xx = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack([xx, yy], dim=-1)[None]  # grid_sample's (x, y) order


@dataclass(frozen=True)
class MaskTrigger(Trigger):
    """A trigger given as a mask and a pattern, ``x' = (1 − m)·x + m·p`` (what Neural Cleanse reverse-engineers).

    Args:
        mask: ``1×H×W`` or ``C×H×W`` values in [0, 1]; pattern: ``C×H×W``; clip: the input box.
    """

    kind: ClassVar[str] = "mask"
    mask: torch.Tensor
    pattern: torch.Tensor
    clip: tuple[float, float] = (0.0, 1.0)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "mask_l1": float(self.mask.abs().sum()), "clip": self.clip}

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        _check_image(x)
        m, p = self.mask.to(x), self.pattern.to(x)
        return ((1 - m) * x + m * p).clamp(*self.clip)
