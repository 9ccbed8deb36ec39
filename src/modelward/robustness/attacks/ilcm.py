"""Iterative least-likely class method (Kurakin et al.; seed 004 eq 2.14).

A targeted BIM whose target is ``y' = argmin_y p(y | x)`` on the clean input — the class the model finds least
likely — with descending steps ``x^{n+1} = Clip_{x,ε}(x^n − α sign(∇ₓ ℓ(f(x^n), y')))``. Success means the
prediction becomes ``y'`` (targeted success).
"""

from __future__ import annotations

from torch import nn

from modelward.robustness.attacks.bim import BIM


class ILCM(BIM):
    """Iterative least-likely class method (Kurakin et al. 2017; seed 004 eq 2.14).

    A targeted BIM towards ``y' = argmin p(y | x)``, the class the model finds least likely on the clean input;
    success means the prediction became ``y'``.

    Args:
        model: the classifier under attack (returns logits).
        eps: the ℓ∞ budget ε.
        alpha: step size (default ``1.25 ε / steps``).
        steps: iterations (default as :class:`BIM`).
        clip: the input box ``(low, high)``.
        seed: seeds every random choice.
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
        >>> res = ILCM(model, eps=0.3, steps=10)(x, y)
        >>> res.success.shape
        torch.Size([8])
    """

    name = "ilcm"

    def __init__(self, model: nn.Module, eps: float = 0.1, alpha: float | None = None, steps: int | None = None,
                 clip: tuple[float, float] = (0.0, 1.0), seed: int = 0, batch_size: int | None = None) -> None:
        # targeted=True with no explicit target uses EvasionAttack.default_target: the least-likely class.
        super().__init__(model, eps, alpha, steps, clip, targeted=True, seed=seed, batch_size=batch_size)
