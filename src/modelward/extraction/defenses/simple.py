"""Static baselines (ModelGuard paper, Sec. 4.1 / App. B.2): Top-1, Rounding, and Gaussian noise (Remark 3)."""

from __future__ import annotations

import torch
from torch import Tensor

from modelward.errors import ConfigError
from modelward.extraction.defenses.base import PredictionDefense


class TopOne(PredictionDefense):
    """Return the one-hot argmax (static quantization with one centroid per class; ℓ1 = 2(1 − y_max)).

    Args:
        (none)

    Returns:
        ``defense.defend(probs)`` (``probs``: a B × K batch of probability vectors) returns the perturbed vectors,
        B × K on the simplex; ``x=`` passes the queried inputs to defenses that need them.

    Example:
        >>> import torch
        >>> y = torch.tensor([[0.7, 0.2, 0.1], [0.4, 0.35, 0.25]])
        >>> TopOne().defend(y).tolist()
        [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
    """

    name = "top1"
    fast = True  # a full batch answers in well under a millisecond (the guard skips the thread hop)
    epsilon = None

    def _defend(self, y: Tensor, x: Tensor | None) -> Tensor:
        out = torch.zeros_like(y)
        out[torch.arange(y.shape[0]), y.argmax(1)] = 1.0
        return out

    def params(self) -> dict[str, float | int | str | bool | None]:
        return {}


class Rounding(PredictionDefense):
    """Round every probability to ``decimals`` places (static per-dimension quantization).

    Convention: the official code calls ``np.round(y, 1)``, whose output need not sum to 1. We keep the output on
    the simplex by *largest-remainder* rounding: floor every entry to the 10^-d grid, then hand the missing grid
    units to the entries with the largest remainders (ties by class index). Every entry moves by less than one grid
    step, and where plain rounding already sums to 1 (the paper's example [0.12,0.31,0.26,0.31] → [0.1,0.3,0.3,0.3])
    the two agree. Rounding can make the top class tie with another, so ``preserves_top1`` is False (``argmax`` of
    a tie picks the lowest index).

    Args:
        decimals: decimal places kept, 0–6.

    Returns:
        ``defense.defend(probs)`` (``probs``: a B × K batch of probability vectors) returns the perturbed vectors,
        B × K on the simplex; ``x=`` passes the queried inputs to defenses that need them.

    Example:
        >>> import torch
        >>> Rounding(decimals=1).defend(torch.tensor([[0.12, 0.31, 0.26, 0.31]], dtype=torch.float64)).tolist()
        [[0.1, 0.3, 0.3, 0.3]]
    """

    name = "rounding"
    fast = True  # a full batch answers in well under a millisecond (the guard skips the thread hop)
    preserves_top1 = False
    epsilon = None

    def __init__(self, decimals: int = 1) -> None:
        if not isinstance(decimals, int) or not 0 <= decimals <= 6:
            raise ConfigError(f"defense rounding: decimals must be an integer in [0, 6], got {decimals!r}")
        self.decimals = decimals

    def _defend(self, y: Tensor, x: Tensor | None) -> Tensor:
        scale = 10 ** self.decimals
        u = y * scale
        f = torch.floor(u + 1e-9)  # 1e-9: 0.3*10 = 2.9999999999999996 must floor to 3
        deficit = (scale - f.sum(1)).round().clamp(0, y.shape[1]).long()
        rem = u - f
        order = torch.sort(-rem, dim=1, stable=True).indices
        rank = torch.empty_like(order)
        rank.scatter_(1, order, torch.arange(y.shape[1]).expand_as(order).contiguous())
        f = f + (rank < deficit[:, None]).to(f.dtype)
        return f / scale

    def params(self) -> dict[str, float | int | str | bool | None]:
        return {"decimals": self.decimals}


class GaussianNoise(PredictionDefense):
    """Add N(0, σ²) noise to the probabilities, clip at 0 and renormalise (a randomised defense).

    The paper excludes random defenses (Remark 3: with repeated queries the attacker averages the noise away); this
    is here to demonstrate exactly that. Convention: noise in probability space (the official, unused ``RandomNoise``
    adds it in logit space). Neither top-1 nor an ℓ1 bound is guaranteed. Seeded: the same seed and query sequence
    give the same answers.

    Args:
        sigma: standard deviation σ of the noise (probability units).
        seed: seeds the noise generator.

    Returns:
        ``defense.defend(probs)`` (``probs``: a B × K batch of probability vectors) returns the perturbed vectors,
        B × K on the simplex; ``x=`` passes the queried inputs to defenses that need them.

    Example:
        >>> import torch
        >>> y = torch.tensor([[0.7, 0.2, 0.1], [0.4, 0.35, 0.25]])
        >>> out = GaussianNoise(sigma=0.05, seed=0).defend(y)
        >>> torch.allclose(out.sum(1), torch.ones(2, dtype=out.dtype))
        True
    """

    name = "gaussian_noise"
    fast = True  # a full batch answers in well under a millisecond (the guard skips the thread hop)
    preserves_top1 = False
    epsilon = None

    def __init__(self, sigma: float = 0.05, seed: int = 0) -> None:
        if not sigma >= 0:
            raise ConfigError(f"defense gaussian_noise: sigma must be >= 0, got {sigma!r}")
        self.sigma = float(sigma)
        self.seed = int(seed)
        self._gen = torch.Generator().manual_seed(self.seed)

    def _defend(self, y: Tensor, x: Tensor | None) -> Tensor:
        noisy = (y + self.sigma * torch.randn(y.shape, generator=self._gen, dtype=y.dtype)).clamp_min(0.0)
        s = noisy.sum(1, keepdim=True)
        # an all-zero row (every entry pushed below 0) falls back to the clean vector
        return torch.where(s > 0, noisy / s.clamp_min(1e-12), y)

    def params(self) -> dict[str, float | int | str | bool | None]:
        return {"sigma": self.sigma, "seed": self.seed}
