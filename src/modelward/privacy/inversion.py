"""Model inversion (seed 002 Eq. 8.1; Fredrikson et al. 2015): x' = argmin_{x'} L(j, f(x')) s.t. x' ∈ [lo, hi]ⁿ.

Solved by projected gradient descent in input space from a chosen seed image. The thesis' reconstruction recipe
for property inference (§8.5, App. D.1): 128 iterations, x₀ = 0 (blank), the gradient ℓ2-normalised to a step of
0.001 each iteration (x ← Π(x − η ∇/‖∇‖₂)); for visual inspection "standard" gradient steps from a grey seed.
The loss L on class j is cross-entropy (default) or the negative logit of j; the box is optional (the thesis
states [0, 1] but its inputs are normalised — pass ``box=None`` to leave the input unconstrained).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from modelward.core.modules import eval_mode, model_device
from modelward.errors import ConfigError

Loss = Literal["cross_entropy", "neg_logit", "neg_log_softmax_margin"]
Step = Literal["l2", "sign", "plain"]


@dataclass(frozen=True)
class InversionResult:
    """Reconstructions ``x`` (one per target), their target classes, final losses and the model's confidence."""

    x: torch.Tensor
    targets: torch.Tensor
    loss: torch.Tensor
    confidence: torch.Tensor


def _loss(logits: torch.Tensor, j: torch.Tensor, kind: Loss) -> torch.Tensor:
    if kind == "cross_entropy":
        return F.cross_entropy(logits, j, reduction="none")
    if kind == "neg_logit":
        return -logits.gather(1, j[:, None])[:, 0]
    # margin: −(z_j − max_{i≠j} z_i); keeps pushing until j wins by a margin
    zj = logits.gather(1, j[:, None])[:, 0]
    other = logits.scatter(1, j[:, None], float("-inf")).amax(1)
    return -(zj - other)


def invert(model: nn.Module, targets: torch.Tensor | list[int], x0: torch.Tensor | float = 0.0,
           input_shape: tuple[int, ...] | None = None, steps: int = 128, step_size: float = 0.001,
           loss: Loss = "cross_entropy", step: Step = "l2",
           box: tuple[float, float] | None = (0.0, 1.0)) -> InversionResult:
    """Projected gradient descent on Eq. 8.1, one reconstruction per entry of ``targets``.

    Args:
        model: any classifier returning logits (a GloRo net's ⊥ logit is not part of L; pass ``net.f``).
        targets: class j of each reconstruction.
        x0: the seed: a tensor (one image, broadcast, or one per target) or a constant fill (0 = blank, 0.5 = grey).
        input_shape: per-example input shape (needed when ``x0`` is a constant).
        steps, step_size: iterations and step length (ℓ2-normalised steps: each moves exactly ``step_size``).
        loss: L(j, f(x)): ``cross_entropy`` (default), ``neg_logit`` or the logit margin.
        step: ``l2`` (x ← x − η g/‖g‖₂, App. D.1), ``sign`` (ℓ∞ steps), ``plain`` (x ← x − η g).
        box: projection box [lo, hi] applied after every step, or None.
    Returns:
        :class:`InversionResult` with the reconstructions (same dtype/device as the model's parameters).
    Example:
        >>> rec = invert(net, [3, 7], x0=0.0, input_shape=(1, 8, 8), steps=128, step_size=0.05)  # doctest: +SKIP
        >>> rec.x.shape   # torch.Size([2, 1, 8, 8])  # doctest: +SKIP
    """
    if steps < 0 or step_size <= 0:
        raise ConfigError(f"inversion: steps must be >= 0 and step_size > 0 (got {steps}, {step_size})")
    if loss not in ("cross_entropy", "neg_logit", "neg_log_softmax_margin"):
        raise ConfigError(f"inversion.loss {loss!r}: valid choices: cross_entropy, neg_logit, neg_log_softmax_margin")
    if step not in ("l2", "sign", "plain"):
        raise ConfigError(f"inversion.step {step!r}: valid choices: l2, sign, plain")
    p = next(model.parameters(), None)
    dev = model_device(model)
    dtype = p.dtype if p is not None else torch.float32
    j = torch.as_tensor(targets, dtype=torch.long, device=dev).reshape(-1)
    if isinstance(x0, torch.Tensor):
        x = x0.to(dev, dtype)
        if input_shape is not None and x.shape == tuple(input_shape):
            x = x[None]
        x = x.expand(len(j), *x.shape[1:]).clone() if len(x) == 1 else x.clone()
        if len(x) != len(j):
            raise ConfigError(f"inversion: x0 holds {len(x)} seeds for {len(j)} targets")
    else:
        if input_shape is None:
            raise ConfigError("inversion: input_shape is needed when x0 is a constant")
        x = torch.full((len(j), *input_shape), float(x0), device=dev, dtype=dtype)
    if box is not None:
        x = x.clamp(*box)
    with eval_mode(model, frozen_params=True):
        for _ in range(steps):
            x = x.detach().requires_grad_(True)
            with torch.enable_grad():
                per = _loss(model(x), j, loss)
                (g,) = torch.autograd.grad(per.sum(), x)
            with torch.no_grad():
                if step == "l2":
                    norm = g.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, *([1] * (g.dim() - 1)))
                    x = x - step_size * g / norm
                elif step == "sign":
                    x = x - step_size * g.sign()
                else:
                    x = x - step_size * g
                if box is not None:
                    x = x.clamp(*box)
        with torch.no_grad():
            logits = model(x)
            final = _loss(logits, j, loss)
            conf = F.softmax(logits, 1).gather(1, j[:, None])[:, 0]
    return InversionResult(x.detach(), j, final.detach(), conf.detach())


def random_targets(n: int, num_classes: int, generator: torch.Generator) -> torch.Tensor:
    """j ∼ Uniform over the model's classes (digest §0: the thesis' 'Categorical(m), m = 14' is a typo)."""
    return torch.randint(0, num_classes, (n,), generator=generator)
