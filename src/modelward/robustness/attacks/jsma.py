"""Jacobian-based saliency map attack (Papernot et al. 2016; seed 004 §2.2, L0).

Targeted: at every iteration the forward derivative gives, for each pair of still-free features (p, q),
``α = ∂Z_t/∂x_p + ∂Z_t/∂x_q`` and ``β = Σ_{j≠t} (∂Z_j/∂x_p + ∂Z_j/∂x_q)``; the pair with α > 0, β < 0 and the
largest ``α·|β|`` is pushed by θ (default: to the top of the box) and removed from the search domain. Stops per
example on success or when ``gamma`` (fraction of features) is spent — the L0 budget it never exceeds.
Untargeted mode targets each example's runner-up class; success then means any change of label.
"""

from __future__ import annotations

import torch
from torch import nn

from modelward.errors import ConfigError
from modelward.robustness.attacks.base import EvasionAttack


class JSMA(EvasionAttack):
    """Jacobian-based saliency map attack (Papernot et al. 2016; seed 004 §2.2): an ℓ0 attack, no ε.

    Each iteration pushes the pair of features with the largest saliency ``α·|β|`` (α > 0, β < 0) by ``theta``;
    it stops on success or when a fraction ``gamma`` of the features has changed (the ℓ0 budget it never exceeds).
    Untargeted mode targets each point's runner-up class.

    Args:
        model: the classifier under attack (returns logits).
        gamma: the largest fraction of features it may change, in (0, 1].
        theta: how far a chosen feature moves (clipped to the box; 1.0 pushes it to the top).
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
        >>> res = JSMA(model, gamma=0.1)(x, y)
        >>> int(((res.x_adv - x).abs() > 0).flatten(1).sum(1).max()) <= 8  # ≤ 10% of 64 features, in pairs
        True
    """

    name = "jsma"
    takes_eps = False  # its budget is gamma, a fraction of the features (ℓ0), never an ε-ball
    default_norm = "l0"
    norms = ("l0",)

    def __init__(self, model: nn.Module, gamma: float = 0.1, theta: float = 1.0,
                 clip: tuple[float, float] = (0.0, 1.0), targeted: bool = False, seed: int = 0,
                 batch_size: int | None = None) -> None:
        if not 0 < gamma <= 1:
            raise ConfigError(f"jsma: gamma (fraction of features to change) must be in (0, 1], got {gamma}")
        if theta == 0:
            raise ConfigError("jsma: theta must be non-zero")
        super().__init__(model, None, "l0", clip, targeted, seed, batch_size)
        self.gamma, self.theta = gamma, theta

    def max_features(self, x: torch.Tensor) -> int:
        return int(self.gamma * x[0].numel())

    def perturb(self, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None,
                gen: torch.Generator) -> torch.Tensor:
        lo, hi = self.clip
        n, d = len(x), x[0].numel()
        if target is None:
            with torch.no_grad():
                logits = self.model(x).clone()
            logits[torch.arange(n, device=y.device), y] = float("-inf")
            label = logits.argmax(1)
        else:
            label = target
        xa = x.detach().flatten(1).clone()
        # a feature is free while it can still move in θ's direction
        free = xa < hi if self.theta > 0 else xa > lo
        budget = self.max_features(x)
        changed = torch.zeros(n, dtype=torch.long, device=x.device)
        rows = torch.arange(n, device=x.device)
        eye = ~torch.eye(d, dtype=torch.bool, device=x.device)
        for _ in range((budget + 1) // 2):
            xin = xa.view_as(x).detach().requires_grad_(True)
            with torch.enable_grad():
                logits = self.model(xin)
                zt = logits.gather(1, label[:, None]).sum()
                (gt,) = torch.autograd.grad(zt, xin, retain_graph=True)
                (gall,) = torch.autograd.grad(logits.sum(), xin)
            pred = logits.argmax(1)
            done = (pred == label) if target is not None else (pred != y)
            active = ~done & (changed + 2 <= budget) & (free.sum(1) >= 2)
            if not bool(active.any()):
                break
            a = gt.flatten(1)
            b = gall.flatten(1) - a
            if self.theta < 0:  # decreasing features: the useful derivatives change sign
                a, b = -a, -b
            alpha = a[:, :, None] + a[:, None, :]
            beta = b[:, :, None] + b[:, None, :]
            ok = (alpha > 0) & (beta < 0) & free[:, :, None] & free[:, None, :] & eye
            score = torch.where(ok, alpha * (-beta), torch.zeros_like(alpha))
            best = score.flatten(1).argmax(1)
            p, q = best // d, best % d
            has = score.flatten(1).max(1).values > 0
            step = active & has
            if not bool(step.any()):
                break
            r = rows[step]
            for idx in (p[step], q[step]):
                xa[r, idx] = (xa[r, idx] + self.theta).clamp(lo, hi)
                free[r, idx] = False
            changed[step] += 2
        return xa.view_as(x)
