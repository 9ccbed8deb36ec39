"""Basic iterative method (Kurakin et al.; seed 004 eq 2.13).

The thesis prints the gradient at the clean input and no sign; we implement Kurakin's standard form (digest §3):
``x^{n+1} = Clip_{x,ε}(x^n + α sign(∇ₓ ℓ(f(x^n), y)))`` from ``x^0 = x`` — L∞ PGD without random start.
Defaults: ``steps = min(ε·255 + 4, 1.25 ε·255)`` (Kurakin et al.) and α = 1.25 ε / steps, so the walk can reach
the surface of the ball (Kurakin's α = 1/255 assumes 8-bit images).
"""

from __future__ import annotations

from torch import nn

from modelward.robustness.attacks.pgd import PGD


def kurakin_steps(eps: float) -> int:
    """Kurakin et al.'s iteration count ``min(ε·255 + 4, 1.25 ε·255)`` (ε on the [0, 1] scale), at least 1."""
    e = eps * 255.0
    return max(1, int(min(e + 4, 1.25 * e)))


class BIM(PGD):
    """Basic iterative method (Kurakin et al. 2017; seed 004 eq 2.13): ℓ∞ PGD without random start.

    ``x^{n+1} = Clip_{x,ε}(x^n + α · sign(∇ₓ ℓ(f(x^n), y)))`` from ``x^0 = x``.

    Args:
        model: the classifier under attack (returns logits).
        eps: the ℓ∞ budget ε.
        alpha: step size (default ``1.25 ε / steps``, so the walk can reach the surface of the ball).
        steps: iterations (default Kurakin's ``min(255 ε + 4, 1.25 · 255 ε)``).
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
        >>> res = BIM(model, eps=0.1, steps=5)(x, y)
        >>> float((res.x_adv - x).abs().max()) <= 0.1 + 1e-6
        True
    """

    name = "bim"

    def __init__(self, model: nn.Module, eps: float = 0.1, alpha: float | None = None, steps: int | None = None,
                 clip: tuple[float, float] = (0.0, 1.0), targeted: bool = False, seed: int = 0,
                 batch_size: int | None = None) -> None:
        steps = steps if steps is not None else kurakin_steps(eps)
        alpha = alpha if alpha is not None else 1.25 * eps / steps
        super().__init__(model, eps, alpha, steps, "linf", random_start=False, restarts=1, clip=clip,
                         targeted=targeted, seed=seed, batch_size=batch_size)
