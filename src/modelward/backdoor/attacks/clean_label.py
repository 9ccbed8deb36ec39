"""Clean-label backdoor (Turner, Tsipras & Madry 2019, "Label-Consistent Backdoor Attacks", §4): only rows of the
target class are poisoned and they keep their (correct) label. To make the model rely on the trigger rather than on
the rows' content, each poisoned row is first made hard to classify by an adversarial perturbation against a
surrogate model (projected gradient descent in an L∞ ball of radius ``eps``, Madry et al. 2018), then the trigger
is stamped on it (a patch at reduced amplitude in all four corners, the paper's §4.3 variant, by default).

Without a surrogate the rows only get the trigger (the "naive" clean-label baseline of the paper's Fig. 3, which
the paper shows to be weak); the bench and the examples train a surrogate on the clean data first.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from modelward.backdoor.attacks.base import BackdoorAttack
from modelward.backdoor.triggers import PatchTrigger, Trigger
from modelward.core.modules import eval_mode


class _Corners(Trigger):
    """The same patch in the four corners (Turner et al. §4.3: survives flips and crops)."""

    kind = "corners"

    def __init__(self, size: int, amplitude: float, clip: tuple[float, float]) -> None:
        self.patches = [PatchTrigger(size=size, location=loc, pattern="checker", amplitude=amplitude, clip=clip)
                        for loc in ("top_left", "top_right", "bottom_left", "bottom_right")]
        self.size, self.amplitude, self.clip = size, amplitude, clip

    def to_dict(self) -> dict:
        return {"kind": self.kind, "size": self.size, "amplitude": self.amplitude, "clip": self.clip}

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        for p in self.patches:
            x = p.apply(x)
        return x


class CleanLabel(BackdoorAttack):
    """Label-consistent attack: PGD-perturbed target-class rows with a trigger, labels unchanged.

    Args:
        target, rate, seed: see :class:`~modelward.backdoor.attacks.base.BackdoorAttack`; ``rate`` is a fraction
            of the whole training set and cannot exceed the target class's share.
        surrogate: the model whose loss the perturbation raises (None: no perturbation).
        eps, steps: the L∞ radius and PGD steps (step size 2.5·eps/steps, Madry et al.).
        size, amplitude: the corner patches; corners: four corners (True) or one bottom-right patch.
        clip: the input box.

    Returns:
        An attack: ``poison(x, y)`` → ``PoisonedSet`` (labels unchanged), ``apply(x)`` the test-time trigger.

    Example:
        >>> import torch
        >>> ps = CleanLabel(target=1, rate=0.05).poison(torch.rand(100, 1, 8, 8), torch.arange(100) % 10)
        >>> ps.n_poisoned, bool((ps.y == torch.arange(100) % 10).all())
        (5, True)
    """

    name = "clean_label"
    dirty_label = False

    def __init__(self, target: int = 0, rate: float = 0.05, seed: int = 0, surrogate: nn.Module | None = None,
                 eps: float = 0.2, steps: int = 10, size: int = 2, amplitude: float = 1.0, corners: bool = True,
                 clip: tuple[float, float] = (0.0, 1.0),
                 pattern: Literal["checker", "white", "random"] = "checker") -> None:
        clip = tuple(clip)  # type: ignore[assignment]
        trigger: Trigger = (_Corners(size, amplitude, clip) if corners else
                            PatchTrigger(size=size, pattern=pattern, amplitude=amplitude, seed=seed, clip=clip))
        super().__init__(trigger, target, rate, seed)
        self.surrogate = surrogate
        self.eps, self.steps = float(eps), int(steps)

    def describe(self) -> dict:
        return {**super().describe(), "eps": self.eps, "steps": self.steps,
                "surrogate": self.surrogate is not None}

    def _poison_rows(self, x: torch.Tensor, y: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        if self.surrogate is not None and self.eps > 0:
            x = self._pgd(self.surrogate, x, y)
        return self.apply(x)

    def _pgd(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # untargeted L∞ PGD (Madry et al. 2018) written out here: the backdoor area sits below the robustness area
        # in the house's layers (the guard hosts STRIP), so it cannot use modelward.robustness's PGD
        lo, hi = self.trigger.clip
        step = 2.5 * self.eps / max(self.steps, 1)
        x_adv = x.clone()
        with eval_mode(model, frozen_params=True):
            for _ in range(self.steps):
                x_adv.requires_grad_(True)
                loss = F.cross_entropy(model(x_adv), y)
                (grad,) = torch.autograd.grad(loss, x_adv)
                x_adv = x_adv.detach() + step * grad.sign()
                x_adv = (x + (x_adv - x).clamp(-self.eps, self.eps)).clamp(lo, hi)
        return x_adv.detach()
