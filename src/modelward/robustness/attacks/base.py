"""Common behaviour of evasion attacks (seed 004 §2.1): ``attack(x, y) -> AttackResult(x_adv, success)``.

Contract of every :class:`EvasionAttack` (torchattacks-like):

- the model is put in eval mode (and its parameters stop requiring grad) for the attack and restored afterwards;
- ``x_adv`` lies inside the input box ``clip`` and — for attacks with a budget — inside the ε-ball of its norm
  around ``x`` (a final projection enforces both, so numerical drift inside an attack cannot leak out);
- ``success[i]`` is True when the final prediction on ``x_adv[i]`` differs from ``y[i]`` (untargeted, eq 2.6;
  points already misclassified count as successes, so ``1 - success.mean()`` is the robust accuracy) or equals
  ``target[i]`` (targeted, eq 2.5);
- every random choice is drawn from a ``torch.Generator`` seeded with ``seed``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from modelward.core.modules import eval_mode, model_device
from modelward.errors import ConfigError

Norm = Literal["linf", "l2", "l0", "none"]


@dataclass(frozen=True)
class AttackResult:
    """Adversarial inputs and the per-example success mask (bool).

    Args:
        x_adv: the adversarial inputs (same shape as the attacked ``x``).
        success: bool per example (untargeted: prediction ≠ y; targeted: prediction = target).

    Returns:
        ``success_rate``: the fraction of successes (1 − robust accuracy for untargeted attacks).

    Example:
        >>> import torch
        >>> AttackResult(torch.zeros(4, 2), torch.tensor([True, False, True, True])).success_rate
        0.75
    """

    x_adv: torch.Tensor
    success: torch.Tensor

    @property
    def success_rate(self) -> float:
        return float(self.success.float().mean().item()) if len(self.success) else 0.0


def attack_mode(model: nn.Module) -> AbstractContextManager[nn.Module]:
    """Eval mode and frozen parameters for the attack; both restored per module / parameter on exit (even on error).

    The same as :func:`modelward.core.modules.eval_mode` with ``frozen_params=True``, kept under this name for the
    attacks and their callers.
    """
    return eval_mode(model, frozen_params=True)


@torch.no_grad()
def predict(model: nn.Module, x: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
    """Arg-max class of every row (in the model's current mode), on the model's device."""
    dev = model_device(model)
    return torch.cat([model(x[i : i + batch_size].to(dev)).argmax(1) for i in range(0, len(x), batch_size)])


def project_linf(x_adv: torch.Tensor, x: torch.Tensor, eps: float, clip: tuple[float, float]) -> torch.Tensor:
    delta = (x_adv - x).clamp_(-eps, eps)
    return (x + delta).clamp_(*clip)


def l2_norms(t: torch.Tensor) -> torch.Tensor:
    """Per-example L2 norm, shaped to broadcast against ``t``."""
    return t.flatten(1).norm(dim=1).view(-1, *([1] * (t.dim() - 1)))


def project_l2(x_adv: torch.Tensor, x: torch.Tensor, eps: float, clip: tuple[float, float]) -> torch.Tensor:
    """Project onto the L2 ε-ball, then into the box. Box clipping of a point inside a ball centred at a box point
    cannot increase its distance to the centre (the box is convex and contains x), so the result stays in both."""
    delta = x_adv - x
    factor = (eps / l2_norms(delta).clamp_min(1e-12)).clamp_(max=1.0)
    return (x + delta * factor).clamp_(*clip)


class EvasionAttack:
    """Base class: subclasses implement :meth:`perturb` on one batch, already in attack mode.

    ``norm``/``eps`` describe the budget the final projection enforces (``norm="none"`` = unbounded attacks such as
    C&W and L-BFGS, which minimise the perturbation instead; ``"l0"`` = JSMA, which enforces its own pixel budget).
    The class attributes ``takes_eps`` / ``default_norm`` / ``norms`` declare the threat model (see
    :func:`modelward.robustness.attacks.threat_model`), so ε sweeps only compare attacks of the same norm.

    Args:
        model: the classifier under attack (returns logits).
        eps: the budget ε (None for minimum-norm attacks).
        norm: the norm the final projection enforces (``"linf"``, ``"l2"``, ``"l0"``, ``"none"``).
        clip: the input box.
        targeted: attack towards a target class.
        seed: seeds every random choice.
        batch_size: attack this many points at a time (default: all).

    Returns:
        ``attack(x, y, target=None)`` returns an :class:`AttackResult`.

    Example (a one-step attack of your own)::

        class SignStep(EvasionAttack):
            name = "sign_step"

            def perturb(self, x, y, target, gen):
                return x + self.eps * self.ascent_grad(x, y, target).sign()

        result = SignStep(model, eps=0.1, norm="linf")(x, y)
    """

    name: ClassVar[str] = "attack"
    supports_targeted: ClassVar[bool] = True
    # threat model: does the attack search inside an ε-ball (``takes_eps``), and in which norm — for norm-selectable
    # attacks ``default_norm`` is the constructor's default and the instance's ``norm`` the one in use; minimum-norm
    # attacks (C&W, L-BFGS: ℓ2; JSMA: ℓ0 with its own feature budget) take no ε and report the perturbation instead
    takes_eps: ClassVar[bool] = True
    default_norm: ClassVar[Norm] = "linf"
    norms: ClassVar[tuple[Norm, ...]] = ("linf",)

    def __init__(self, model: nn.Module, eps: float | None = None, norm: Norm = "none",
                 clip: tuple[float, float] = (0.0, 1.0), targeted: bool = False, seed: int = 0,
                 batch_size: int | None = None) -> None:
        if eps is not None and eps < 0:
            raise ConfigError(f"{self.name}: eps must be >= 0, got {eps}")
        if clip[0] >= clip[1]:
            raise ConfigError(f"{self.name}: clip must be (low, high) with low < high, got {clip}")
        if targeted and not self.supports_targeted:
            raise ConfigError(f"{self.name}: targeted mode is not supported by this attack")
        if batch_size is not None and batch_size < 1:
            raise ConfigError(f"{self.name}: batch_size must be >= 1, got {batch_size}")
        self.model = model
        self.eps = None if eps is None else float(eps)
        self.norm: Norm = norm
        self.clip = (float(clip[0]), float(clip[1]))
        self.targeted = targeted
        self.seed = seed
        self.batch_size = batch_size

    # -- hooks -------------------------------------------------------------------------------------------------
    def perturb(self, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None,
                gen: torch.Generator) -> torch.Tensor:
        """Return adversarial inputs for one batch. ``target`` is set iff the attack is targeted."""
        raise NotImplementedError

    def default_target(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Targeted mode without explicit targets: the least-likely class (Kurakin et al., ILCM)."""
        with torch.no_grad():
            logits = self.model(x)
        logits = logits.clone()
        logits[torch.arange(len(y), device=y.device), y] = float("inf")
        return logits.argmin(1)

    def ascent_grad(self, x_adv: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
        """∇ₓ of the objective the attack ascends: ℓ(f(x), y) untargeted (eq 2.6), −ℓ(f(x), y') targeted (eq 2.5).

        Summed (not averaged) over the batch so each example's gradient is independent of the batch size.
        """
        x_adv = x_adv.detach().requires_grad_(True)
        with torch.enable_grad():
            logits = self.model(x_adv)
            if target is None:
                loss = F.cross_entropy(logits, y, reduction="sum")
            else:
                loss = -F.cross_entropy(logits, target, reduction="sum")
            (grad,) = torch.autograd.grad(loss, x_adv)
        return grad

    # -- driver ------------------------------------------------------------------------------------------------
    def __call__(self, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None = None) -> AttackResult:
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"{self.name}: x has {x.shape[0]} rows but y has {y.shape[0]}")
        if target is not None and not self.targeted:
            raise ConfigError(f"{self.name}: target given but the attack is untargeted (set targeted=True)")
        dev = model_device(self.model)  # inputs go to the model's device; the adversarial examples stay there
        x = x.detach().to(dev)
        y = y.detach().long().to(dev)
        target = target.to(dev) if target is not None else None
        gen = torch.Generator(device=x.device).manual_seed(self.seed)
        bs = self.batch_size or max(1, len(x))
        outs, succ = [], []
        with attack_mode(self.model):
            for i in range(0, len(x), bs):
                xb, yb = x[i : i + bs], y[i : i + bs]
                tb = None
                if self.targeted:
                    tb = target[i : i + bs].long() if target is not None else self.default_target(xb, yb)
                xa = self.perturb(xb, yb, tb, gen).detach()
                xa = self.enforce(xa, xb)
                pred = predict(self.model, xa)
                outs.append(xa)
                succ.append(pred == tb if tb is not None else pred != yb)
        return AttackResult(torch.cat(outs), torch.cat(succ))

    def enforce(self, x_adv: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Final guarantee: inside the box and the ε-ball of ``norm``."""
        if self.eps is not None and self.norm == "linf":
            return project_linf(x_adv, x, self.eps, self.clip)
        if self.eps is not None and self.norm == "l2":
            return project_l2(x_adv, x, self.eps, self.clip)
        return x_adv.clamp(*self.clip)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(eps={self.eps}, norm={self.norm}, targeted={self.targeted})"
