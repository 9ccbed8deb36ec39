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

    Args:
        model: the model (returns logits); x: the explained inputs.
        target: the quantity of interest: a class index, ``(c1, c2)``, ``"max"`` (default) or a QoI / callable.
        layer: an internal layer to explain (its output is z; None: the input).
        batch_size: most rows per forward/backward pass (None: all at once).

    Returns:
        The gradient, shaped like ``x`` (or like the layer's output with ``layer``).

    Example:
        >>> net = nn.Sequential()
        >>> net.add_module("fc1", nn.Linear(4, 8)); net.add_module("act", nn.ReLU())
        >>> net.add_module("logits", nn.Linear(8, 3))
        >>> x = torch.randn(5, 4)
        >>> saliency(net, x, target=2).shape == x.shape
        True
    """
    return InternalInfluence(model, Slice(layer), target, PointDoI(), batch_size).influence(x)


@METHODS.register("gradient_x_input")
def gradient_x_input(model: nn.Module, x: torch.Tensor, target: Target = "max", layer: str | None = None,
                     batch_size: int | None = 4096) -> torch.Tensor:
    """Gradient × input: the point-DoI attribution with the implicit baseline 0 (§3.1).

    Args:
        model: the model (returns logits); x: the explained inputs.
        target: the quantity of interest: a class index, ``(c1, c2)``, ``"max"`` (default) or a QoI / callable.
        layer: an internal layer to explain (its output is z; None: the input).
        batch_size: most rows per forward/backward pass (None: all at once).

    Returns:
        gradient ⊙ x (⊙ z with ``layer``), shaped like ``x``.

    Example:
        >>> net = nn.Sequential()
        >>> net.add_module("fc1", nn.Linear(4, 8)); net.add_module("act", nn.ReLU())
        >>> net.add_module("logits", nn.Linear(8, 3))
        >>> x = torch.randn(5, 4)
        >>> gradient_x_input(net, x, target=2).shape == x.shape
        True
    """
    return InternalInfluence(model, Slice(layer), target, PointDoI(), batch_size).attribution(x)


@METHODS.register("smoothgrad")
def smoothgrad(model: nn.Module, x: torch.Tensor, target: Target = "max", std: float = 0.15, samples: int = 50,
               seed: int = 0, layer: str | None = None, batch_size: int | None = 4096) -> torch.Tensor:
    """SmoothGrad (Smilkov et al.): the mean gradient over x + N(0, std²) — internal influence with a Gaussian
    DoI (§3.4). ``std`` is in input units (SmoothGrad's "noise level" × (max − min)).

    Args:
        model: the model (returns logits); x: the explained inputs.
        target: the quantity of interest: a class index, ``(c1, c2)``, ``"max"`` (default) or a QoI / callable.
        std: the noise standard deviation; samples: noisy copies per input; seed: the noise seed.
        layer: an internal layer to explain (its output is z; None: the input).
        batch_size: most rows per forward/backward pass (None: all at once).

    Returns:
        The mean gradient, shaped like ``x``.

    Example:
        >>> net = nn.Sequential()
        >>> net.add_module("fc1", nn.Linear(4, 8)); net.add_module("act", nn.ReLU())
        >>> net.add_module("logits", nn.Linear(8, 3))
        >>> x = torch.randn(5, 4)
        >>> smoothgrad(net, x, target=2, std=0.1, samples=8).shape == x.shape
        True
    """
    doi = GaussianDoI(std=std, samples=samples, seed=seed)
    return InternalInfluence(model, Slice(layer), target, doi, batch_size).influence(x)


@METHODS.register("integrated_gradients")
def integrated_gradients(model: nn.Module, x: torch.Tensor, target: Target = "max",
                         baseline: torch.Tensor | float | None = None, steps: int = 50, rule: str = "gausslegendre",
                         layer: str | None = None, batch_size: int | None = 4096) -> torch.Tensor:
    """Integrated gradients (Eq. 3.3): (x − x0) ⊙ ∫_0^1 ∇f(x0 + α(x − x0)) dα — the attribution of the straight-line
    DoI. At an internal ``layer`` the path runs between h(x0) and h(x) (Captum's ``LayerIntegratedGradients``).
    Completeness: Σ attribution ≈ q(x) − q(x0), exactly in the limit of many steps.

    Args:
        model: the model (returns logits); x: the explained inputs.
        target: the quantity of interest: a class index, ``(c1, c2)``, ``"max"`` (default) or a QoI / callable.
        baseline: the path's start x0 (tensor or number; None = zeros).
        steps: points on the path; rule: the quadrature rule (default ``"gausslegendre"``).
        layer: an internal layer to explain (its output is z; None: the input).
        batch_size: most rows per forward/backward pass (None: all at once).

    Returns:
        The attribution, shaped like ``x`` (like the layer's output with ``layer``).

    Example:
        >>> net = nn.Sequential()
        >>> net.add_module("fc1", nn.Linear(4, 8)); net.add_module("act", nn.ReLU())
        >>> net.add_module("logits", nn.Linear(8, 3))
        >>> x = torch.randn(5, 4)
        >>> integrated_gradients(net, x, target=2, steps=16).shape == x.shape
        True
    """
    doi = LinearDoI(baseline, steps, rule, space="slice" if layer else "input")
    return InternalInfluence(model, Slice(layer), target, doi, batch_size).attribution(x)
