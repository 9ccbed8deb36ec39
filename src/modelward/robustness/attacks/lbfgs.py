"""Box-constrained L-BFGS attack (Szegedy et al. 2014; seed 004 eq 2.9 and digest §3).

The thesis gives only "find r with f(x + r) = l"; the objective is Szegedy's: minimise
``‖r‖²₂ + c · ℓ(f(x + r), l)`` subject to ``x + r ∈ [lo, hi]^m``, solved by scipy's L-BFGS-B (the box is handled
exactly by its bounds), with a per-example binary search for the smallest loss weight c that still reaches class
l — equivalently Szegedy's "minimum-distortion" line search over the weight on ‖r‖. The batch is optimised as one
separable problem (the objective is a sum of per-example terms). Untargeted mode targets each example's runner-up
class (the nearest decision boundary in logit order). No ε: a minimum-norm attack (``norm = "none"``).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import minimize
from torch import nn

from modelward.errors import ConfigError
from modelward.robustness.attacks.base import EvasionAttack


class LBFGS(EvasionAttack):
    """Box-constrained L-BFGS attack (Szegedy et al. 2014; seed 004 eq 2.9): a minimum-norm attack, no ε.

    Minimises ``‖r‖²₂ + c · ℓ(f(x + r), l)`` subject to ``x + r`` in the box (scipy L-BFGS-B), with a binary search
    for the smallest ``c`` that still reaches class ``l`` (untargeted: each point's runner-up class).

    Args:
        model: the classifier under attack (returns logits).
        c: initial loss weight (binary-searched per example).
        binary_steps: binary-search steps on ``c``.
        max_iter: L-BFGS-B iterations per search step.
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
        >>> res = LBFGS(model, binary_steps=2, max_iter=10)(x, y)
        >>> res.success.dtype
        torch.bool
    """

    name = "lbfgs"
    takes_eps = False  # a minimum-norm attack: it minimises ‖δ‖₂ instead of searching an ε-ball
    default_norm = "l2"
    norms = ("l2",)

    def __init__(self, model: nn.Module, c: float = 0.1, binary_steps: int = 6, max_iter: int = 50,
                 clip: tuple[float, float] = (0.0, 1.0), targeted: bool = False, seed: int = 0,
                 batch_size: int | None = None) -> None:
        if c <= 0 or binary_steps < 1 or max_iter < 1:
            raise ConfigError("lbfgs: need c > 0, binary_steps >= 1 and max_iter >= 1")
        super().__init__(model, None, "none", clip, targeted, seed, batch_size)
        self.c, self.binary_steps, self.max_iter = c, binary_steps, max_iter

    def _solve(self, x: torch.Tensor, label: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shape, dtype = x.shape, x.dtype
        x64 = x.detach().double()

        def fun(z: np.ndarray) -> tuple[float, np.ndarray]:
            # scipy's iterate lives on the CPU; the model runs on its device
            xa = torch.from_numpy(z).view(shape).to(x.device).requires_grad_(True)
            with torch.enable_grad():
                logits = self.model(xa.to(dtype))
                ce = F.cross_entropy(logits, label, reduction="none").double()
                obj = ((xa - x64).flatten(1).pow(2).sum(1) + c.double() * ce).sum()
                (g,) = torch.autograd.grad(obj, xa)
            return float(obj.detach()), g.flatten().cpu().numpy().astype(np.float64)

        z0 = x64.flatten().cpu().numpy().copy()
        res = minimize(fun, z0, jac=True, method="L-BFGS-B", bounds=[self.clip] * z0.size,
                       options={"maxiter": self.max_iter, "gtol": 1e-10, "ftol": 1e-12})
        return torch.from_numpy(res.x).view(shape).to(x.device, dtype)

    def perturb(self, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None,
                gen: torch.Generator) -> torch.Tensor:
        if target is None:
            with torch.no_grad():
                logits = self.model(x).clone()
            logits[torch.arange(len(y), device=y.device), y] = float("-inf")
            label = logits.argmax(1)  # runner-up class
        else:
            label = target
        n = len(x)
        c = torch.full((n,), self.c, dtype=x.dtype, device=x.device)
        lower = torch.zeros_like(c)
        upper = torch.full_like(c, float("inf"))
        best = x.clone()
        best_l2 = torch.full_like(c, float("inf"))
        for _ in range(self.binary_steps):
            xa = self._solve(x, label, c)
            with torch.no_grad():
                pred = self.model(xa).argmax(1)
            ok = pred == label if target is not None else pred != y
            l2 = (xa - x).flatten(1).pow(2).sum(1)
            better = ok & (l2 < best_l2)
            best[better] = xa[better]
            best_l2 = torch.where(better, l2, best_l2)
            # success → a smaller weight on the loss (smaller r); failure → a larger one
            upper = torch.where(ok, torch.minimum(upper, c), upper)
            lower = torch.where(ok, lower, torch.maximum(lower, c))
            c = torch.where(torch.isinf(upper), c * 10, (lower + upper) / 2)
        return best
