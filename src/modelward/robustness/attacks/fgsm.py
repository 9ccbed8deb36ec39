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
    """One-step fast gradient sign method (Goodfellow et al. 2015; seed 004 eq 2.10–2.12).

    ``x_adv = clip(x + ε · sign(∇ₓ ℓ(f(x), y)))``; with ``norm="l2"`` the step is the normalised gradient (eq 2.12).

    Args:
        model: the classifier under attack (returns logits).
        eps: the budget ε (radius of the ℓ∞ or ℓ2 ball).
        norm: ``"linf"`` (sign step) or ``"l2"`` (normalised-gradient step).
        clip: the input box ``(low, high)``; adversarial inputs never leave it.
        targeted: attack towards ``target`` (passed at call time) instead of away from ``y``.
        seed: seeds every random choice (a ``torch.Generator``; the global RNG is never touched).
        batch_size: attack this many points at a time (default: all at once).

    Returns:
        Calling the attack, ``attack(x, y)`` (targeted: ``attack(x, y, target)``), returns an
        :class:`~modelward.robustness.attacks.base.AttackResult` with ``x_adv`` (same shape as ``x``) and the bool
        ``success`` mask (untargeted: prediction differs from ``y``; targeted: equals the target).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
        >>> x, y = torch.rand(8, 1, 8, 8), torch.randint(10, (8,))
        >>> res = FGSM(model, eps=0.1)(x, y)
        >>> res.x_adv.shape, bool(((res.x_adv - x).abs() <= 0.1 + 1e-6).all())
        (torch.Size([8, 1, 8, 8]), True)
    """

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
