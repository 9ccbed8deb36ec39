"""Iterative least-likely class method (Kurakin et al.; seed 004 eq 2.14).

A targeted BIM whose target is ``y' = argmin_y p(y | x)`` on the clean input — the class the model finds least
likely — with descending steps ``x^{n+1} = Clip_{x,ε}(x^n − α sign(∇ₓ ℓ(f(x^n), y')))``. Success means the
prediction becomes ``y'`` (targeted success).
"""

from __future__ import annotations

from torch import nn

from modelward.robustness.attacks.bim import BIM


class ILCM(BIM):
    name = "ilcm"

    def __init__(self, model: nn.Module, eps: float = 0.1, alpha: float | None = None, steps: int | None = None,
                 clip: tuple[float, float] = (0.0, 1.0), seed: int = 0, batch_size: int | None = None) -> None:
        # targeted=True with no explicit target uses EvasionAttack.default_target: the least-likely class.
        super().__init__(model, eps, alpha, steps, clip, targeted=True, seed=seed, batch_size=batch_size)
