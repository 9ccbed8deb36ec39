"""Carlini & Wagner L2 attack (seed 004 §2.2, ref. [4]; Carlini & Wagner 2017).

Change of variables ``x' = lo + (hi − lo)(tanh(w) + 1)/2`` keeps every iterate in the input box; Adam minimises
``‖x' − x‖²₂ + c · max(Z_y − max_{i≠y} Z_i, −κ)`` (untargeted; targeted: ``max(max_{i≠t} Z_i − Z_t, −κ)``) and a
per-example binary search on c finds the smallest perturbation that still succeeds. Examples the attack never
breaks are returned unchanged. C&W is a minimum-norm attack: it has no ε (``norm = "none"``).
"""

from __future__ import annotations

import torch
from torch import nn

from modelward.errors import ConfigError
from modelward.robustness.attacks.base import EvasionAttack


class CarliniWagnerL2(EvasionAttack):
    """Carlini & Wagner ℓ2 attack (2017; seed 004 §2.2): a minimum-norm attack, no ε.

    Adam minimises ``‖x' − x‖²₂ + c · max(Z_y − max_{i≠y} Z_i, −κ)`` over a tanh change of variables that keeps
    ``x'`` in the box; a per-example binary search on ``c`` finds the smallest perturbation that still succeeds.
    Points never broken are returned unchanged.

    Args:
        model: the classifier under attack (returns logits).
        c: initial weight of the classification term (binary-searched per example).
        kappa: confidence margin κ.
        steps: Adam steps per binary-search step.
        lr: Adam learning rate.
        binary_steps: binary-search steps on ``c``.
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
        >>> res = CarliniWagnerL2(model, steps=20, binary_steps=2)(x, y)
        >>> res.x_adv.shape
        torch.Size([8, 1, 8, 8])
    """

    name = "cw"
    takes_eps = False  # a minimum-norm attack: it minimises ‖δ‖₂ instead of searching an ε-ball
    default_norm = "l2"
    norms = ("l2",)

    def __init__(self, model: nn.Module, c: float = 1.0, kappa: float = 0.0, steps: int = 100, lr: float = 0.01,
                 binary_steps: int = 6, clip: tuple[float, float] = (0.0, 1.0), targeted: bool = False,
                 seed: int = 0, batch_size: int | None = None) -> None:
        if c <= 0 or steps < 1 or binary_steps < 1 or lr <= 0:
            raise ConfigError("cw: need c > 0, lr > 0, steps >= 1 and binary_steps >= 1")
        super().__init__(model, None, "none", clip, targeted, seed, batch_size)
        self.c, self.kappa, self.steps, self.lr, self.binary_steps = c, kappa, steps, lr, binary_steps

    def _margin(self, logits: torch.Tensor, label: torch.Tensor, targeted: bool) -> torch.Tensor:
        own = logits.gather(1, label[:, None]).squeeze(1)
        other = logits.clone()
        other[torch.arange(len(label), device=label.device), label] = float("-inf")
        best_other = other.max(1).values
        m = best_other - own if targeted else own - best_other
        return m.clamp(min=-self.kappa)

    def perturb(self, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None,
                gen: torch.Generator) -> torch.Tensor:
        lo, hi = self.clip
        targeted = target is not None
        label = target if targeted else y
        n = len(x)
        c = torch.full((n,), self.c, dtype=x.dtype, device=x.device)
        lower = torch.zeros_like(c)
        upper = torch.full_like(c, float("inf"))
        best_l2 = torch.full_like(c, float("inf"))
        best = x.clone()
        # atanh of the box-normalised input (shrunk slightly so atanh stays finite at the box edges)
        w0 = torch.atanh(((x - lo) / (hi - lo) * 2 - 1).clamp(-1 + 1e-6, 1 - 1e-6))
        for _ in range(self.binary_steps):
            w = w0.clone().requires_grad_(True)
            opt = torch.optim.Adam([w], lr=self.lr)
            succeeded = torch.zeros(n, dtype=torch.bool, device=x.device)
            for _ in range(self.steps):
                with torch.enable_grad():
                    x_adv = lo + (hi - lo) * (torch.tanh(w) + 1) / 2
                    logits = self.model(x_adv)
                    l2 = (x_adv - x).flatten(1).pow(2).sum(1)
                    loss = (l2 + c * self._margin(logits, label, targeted)).sum()
                    opt.zero_grad()
                    loss.backward()
                opt.step()
                with torch.no_grad():
                    pred = logits.argmax(1)
                    ok = pred == label if targeted else pred != label
                    better = ok & (l2 < best_l2)
                    best_l2 = torch.where(better, l2.detach(), best_l2)
                    best[better] = x_adv.detach()[better]
                    succeeded |= ok
            # binary search on c: success → try a smaller c (smaller perturbation); failure → larger c
            upper = torch.where(succeeded, torch.minimum(upper, c), upper)
            lower = torch.where(succeeded, lower, torch.maximum(lower, c))
            c = torch.where(torch.isinf(upper), c * 10, (lower + upper) / 2)
        return best
