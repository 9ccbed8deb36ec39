"""Fast gradient sign method (Goodfellow et al.; seed 004 eq 2.10 untargeted, eq 2.11 targeted).

``x_adv = x + ε sign(∇ₓ ℓ(f(x), y))`` untargeted, ``x − ε sign(∇ₓ ℓ(f(x), y'))`` targeted, then clipped to the
input box. With ``norm="l2"`` it is the L2 fast-gradient method of eq 2.12 (normalised gradient, no sign).
"""

from __future__ import annotations

import torch
from torch import nn

from modelward.errors import ConfigError
from modelward.robustness.attacks.base import EvasionAttack, Norm, l2_norms


class FGSM(EvasionAttack):
    name = "fgsm"
    norms = ("linf", "l2")

    def __init__(self, model: nn.Module, eps: float = 0.1, norm: Norm = "linf",
                 clip: tuple[float, float] = (0.0, 1.0), targeted: bool = False, seed: int = 0,
                 batch_size: int | None = None) -> None:
        if norm not in ("linf", "l2"):
            raise ConfigError(f"fgsm: norm must be 'linf' or 'l2', got {norm!r}")
        super().__init__(model, eps, norm, clip, targeted, seed, batch_size)

    def perturb(self, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None,
                gen: torch.Generator) -> torch.Tensor:
        g = self.ascent_grad(x, y, target)  # targeted: already the gradient of −ℓ(·, y'), hence eq 2.11's minus
        step = g.sign() if self.norm == "linf" else g / l2_norms(g).clamp_min(1e-12)
        return (x + (self.eps or 0.0) * step).clamp(*self.clip)
