"""Prior attribution methods as special cases of internal influence (seed 002 §3.4, Table in §1.4 of the digest).

Each is a few lines over :class:`~modelward.explain.influence.InternalInfluence`: the method *is* a choice of
distribution of interest (and of influence vs attribution).

| method               | DoI                               | returns                     |
|----------------------|-----------------------------------|-----------------------------|
| saliency             | point mass at x                   | influence (gradient)        |
| gradient × input     | point mass at x, baseline 0       | attribution                 |
| SmoothGrad           | Gaussian around x                 | influence (mean gradient)   |
| integrated gradients | uniform on the path x0 → x        | attribution (Eq. 3.3)       |
"""

from __future__ import annotations

import torch
from torch import nn

from modelward.core.registry import Registry
from modelward.explain.influence import (
    GaussianDoI,
    InternalInfluence,
    LinearDoI,
    PointDoI,
    QuantityOfInterest,
    Slice,
)

Target = QuantityOfInterest | int | tuple[int, int] | str

#: name → attribution method ``fn(model, x, target, **params)``; unknown names list the valid ones
METHODS = Registry("attribution method")


@METHODS.register("saliency")
def saliency(model: nn.Module, x: torch.Tensor, target: Target = "max", layer: str | None = None,
             batch_size: int | None = 4096) -> torch.Tensor:
    """Saliency map (Simonyan et al.): ∇ q∘f at x — internal influence with the point DoI.

    Example:
        >>> saliency(net, x, target=3).shape == x.shape
    """
    return InternalInfluence(model, Slice(layer), target, PointDoI(), batch_size).influence(x)


@METHODS.register("gradient_x_input")
def gradient_x_input(model: nn.Module, x: torch.Tensor, target: Target = "max", layer: str | None = None,
                     batch_size: int | None = 4096) -> torch.Tensor:
    """Gradient × input: the point-DoI attribution with the implicit baseline 0 (§3.1)."""
    return InternalInfluence(model, Slice(layer), target, PointDoI(), batch_size).attribution(x)


@METHODS.register("smoothgrad")
def smoothgrad(model: nn.Module, x: torch.Tensor, target: Target = "max", std: float = 0.15, samples: int = 50,
               seed: int = 0, layer: str | None = None, batch_size: int | None = 4096) -> torch.Tensor:
    """SmoothGrad (Smilkov et al.): the mean gradient over x + N(0, std²) — internal influence with a Gaussian
    DoI (§3.4). ``std`` is in input units (SmoothGrad's "noise level" × (max − min))."""
    doi = GaussianDoI(std=std, samples=samples, seed=seed)
    return InternalInfluence(model, Slice(layer), target, doi, batch_size).influence(x)


@METHODS.register("integrated_gradients")
def integrated_gradients(model: nn.Module, x: torch.Tensor, target: Target = "max",
                         baseline: torch.Tensor | float | None = None, steps: int = 50, rule: str = "gausslegendre",
                         layer: str | None = None, batch_size: int | None = 4096) -> torch.Tensor:
    """Integrated gradients (Eq. 3.3): (x − x0) ⊙ ∫_0^1 ∇f(x0 + α(x − x0)) dα — the attribution of the straight-line
    DoI. At an internal ``layer`` the path runs between h(x0) and h(x) (Captum's ``LayerIntegratedGradients``).
    Completeness: Σ attribution ≈ q(x) − q(x0), exactly in the limit of many steps."""
    doi = LinearDoI(baseline, steps, rule, space="slice" if layer else "input")
    return InternalInfluence(model, Slice(layer), target, doi, batch_size).attribution(x)
