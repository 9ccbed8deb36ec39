"""Projected gradient descent (Madry et al.; seed 004 eq 2.15 with the standard sign step and random start).

The thesis prints ``x^{n+1} = Π_ε(x^n + α ∇ℓ(f(x_i), y_i))`` with the gradient at the clean point and no sign;
we implement Madry's form (digest §3): the gradient at the iterate, a sign step for L∞ (a normalised step for L2),
projection onto the ε-ball and the input box after every step, an optional random start (L∞: uniform in the box
[−ε, ε]^d; L2: a uniform direction at a radius uniform in [0, ε], as torchattacks), and restarts that keep, per
example, the first successful restart (else the last).
"""

from __future__ import annotations

import torch
from torch import nn

from modelward.errors import ConfigError
from modelward.robustness.attacks.base import EvasionAttack, Norm, l2_norms, predict, project_l2


class PGD(EvasionAttack):
    """Projected gradient descent (Madry et al. 2018; seed 004 eq 2.15), ℓ∞ or ℓ2, with random start and restarts.

    Each step ascends the loss at the iterate (sign step for ℓ∞, normalised step for ℓ2) and projects onto the
    ε-ball and the input box; restarts keep, per example, the first successful one.

    Args:
        model: the classifier under attack (returns logits).
        eps: the budget ε.
        alpha: step size (default ``2.5 ε / steps``).
        steps: iterations per restart.
        norm: ``"linf"`` or ``"l2"``.
        random_start: start from a random point of the ball (else from ``x``).
        restarts: independent random starts.
        clip: the input box ``(low, high)``; adversarial inputs never leave it.
        targeted: attack towards ``target`` (passed at call time) instead of away from ``y``.
        seed: seeds every random choice (a ``torch.Generator``; the global RNG is never touched).
        batch_size: attack this many points at a time (default: all at once).
        start_radius: ℓ2 random start: ``"uniform"`` radius (torchattacks) or ``"volume"`` (uniform in the ball).

    Returns:
        Calling the attack, ``attack(x, y)`` (targeted: ``attack(x, y, target)``), returns an
        :class:`~modelward.robustness.attacks.base.AttackResult` with ``x_adv`` (same shape as ``x``) and the bool
        ``success`` mask (untargeted: prediction differs from ``y``; targeted: equals the target).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
        >>> x, y = torch.rand(8, 1, 8, 8), torch.randint(10, (8,))
        >>> res = PGD(model, eps=0.5, norm="l2", steps=10)(x, y)
        >>> bool(((res.x_adv - x).flatten(1).norm(dim=1) <= 0.5 + 1e-5).all())
        True
    """

    name = "pgd"
    norms = ("linf", "l2")

    def __init__(self, model: nn.Module, eps: float = 0.1, alpha: float | None = None, steps: int = 10,
                 norm: Norm = "linf", random_start: bool = True, restarts: int = 1,
                 clip: tuple[float, float] = (0.0, 1.0), targeted: bool = False, seed: int = 0,
                 batch_size: int | None = None, start_radius: str = "uniform") -> None:
        if norm not in ("linf", "l2"):
            raise ConfigError(f"pgd: norm must be 'linf' or 'l2', got {norm!r}")
        if start_radius not in ("uniform", "volume"):
            raise ConfigError(f"pgd: start_radius must be 'uniform' (radius ~ U(0, ε), torchattacks) or 'volume' "
                              f"(uniform in the ball's volume), got {start_radius!r}")
        self.start_radius = start_radius
        if steps < 1 or restarts < 1:
            raise ConfigError(f"pgd: steps and restarts must be >= 1, got steps={steps}, restarts={restarts}")
        super().__init__(model, eps, norm, clip, targeted, seed, batch_size)
        # Madry et al. use α = 2.5 ε / steps so that a full walk can cross the ball.
        self.alpha = float(alpha) if alpha is not None else 2.5 * float(eps) / steps
        self.steps = steps
        self.random_start = random_start
        self.restarts = restarts

    def _start(self, x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        eps = self.eps or 0.0
        if not self.random_start or eps == 0.0:
            return x.clone()
        if self.norm == "linf":
            noise = torch.rand(x.shape, generator=gen, device=x.device, dtype=x.dtype).mul_(2 * eps).sub_(eps)
            return (x + noise).clamp_(*self.clip)
        # a uniformly random direction (normalised Gaussian) at radius ε·U, U ~ U(0, 1) (torchattacks' PGDL2):
        # the start covers the ball from its centre to its surface. (Uniform in the ball's *volume*,
        # start_radius="volume", puts the radius at ε·U^(1/d): in d = 64 dimensions 95% of the starts lie within
        # 5% of the sphere, and 20-step PGD-L2 was 4–8 points weaker than torchattacks on digits.)
        direction = torch.randn(x.shape, generator=gen, device=x.device, dtype=x.dtype)
        direction /= l2_norms(direction).clamp_min(1e-12)
        r = torch.rand(len(x), generator=gen, device=x.device, dtype=x.dtype)
        if self.start_radius == "volume":
            r = r.pow_(1.0 / x[0].numel())
        r = r * eps
        return project_l2(x + direction * r.view(-1, *([1] * (x.dim() - 1))), x, eps, self.clip)

    def _run(self, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None,
             gen: torch.Generator) -> torch.Tensor:
        eps = self.eps or 0.0
        x_adv = self._start(x, gen)
        if self.norm == "linf":
            # the ε-ball ∩ box is a per-coordinate interval: one clamp per step projects onto both
            low, high = (x - eps).clamp_(min=self.clip[0]), (x + eps).clamp_(max=self.clip[1])
        for _ in range(self.steps):
            g = self.ascent_grad(x_adv, y, target)
            with torch.no_grad():
                if self.norm == "linf":
                    x_adv = torch.clamp(x_adv.add_(g.sign_(), alpha=self.alpha), low, high)
                else:
                    step = g / l2_norms(g).clamp_min(1e-12)
                    x_adv = project_l2(x_adv.add_(step, alpha=self.alpha), x, eps, self.clip)
        return x_adv

    def perturb(self, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None,
                gen: torch.Generator) -> torch.Tensor:
        best = self._run(x, y, target, gen)
        if self.restarts == 1:
            return best
        done = self._succeeded(best, y, target)
        for _ in range(self.restarts - 1):
            if bool(done.all()):
                break
            cand = self._run(x, y, target, gen)
            ok = self._succeeded(cand, y, target) & ~done
            best[ok] = cand[ok]
            done |= ok
        return best

    def _succeeded(self, x_adv: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
        pred = predict(self.model, x_adv)
        return pred == target if target is not None else pred != y
