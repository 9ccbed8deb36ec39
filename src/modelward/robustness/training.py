"""Adversarial training: PGD adversarial training (Madry et al.) and TRADES (Zhang et al.).

Robust optimisation, seed 004 eq 5.2: ``min_θ E[max_{δ∈S} ℓ(f_θ(x+δ), y)]`` with S an ε-ball; the inner max is
solved by PGD on every minibatch (§2.3.3, "adversarial training").

Interface (plain functions; ``TrainConfig`` is ``modelward.core.train.TrainConfig``)::

    pgd_adversarial_training(model, x_train, y_train, train_cfg: TrainConfig, adv: AdversarialConfig,
                             seed: int = 0, x_test=None, y_test=None,
                             on_step: Callable[[int, float], None] | None = None) -> AdvTrainResult
    trades_training(...same arguments...) -> AdvTrainResult

- ``train_cfg`` gives optimizer, lr (+ schedule), momentum, weight decay, batch size and the number of steps;
  batches follow ``core.train.batch_order(n, batch_size, seed)``.
- ``adv`` (:class:`AdversarialConfig`) gives ε, norm, PGD step size/steps/random start, the input box, the clean
  mix (Madry: 0 = adversarial examples only) and TRADES' β.
- ``on_step(step, loss)`` is called after every optimiser step (drive a progress bar with it).
- The model is modified in place and left in train mode; the attack runs in eval mode (BatchNorm statistics are
  not updated by attack iterates).
- ``AdvTrainResult`` holds the loss curve, the accuracy on the adversarial training batches (what the thesis's
  "train accuracy post adversarial training" most plausibly measures, digest §7.4), optional clean test error
  curve, and wall time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from modelward.core.config import StrictModel
from modelward.core.device import autocast, model_device
from modelward.core.train import TrainConfig, batch_order, evaluate, make_optimizer
from modelward.robustness.attacks.base import attack_mode, l2_norms, project_l2, project_linf
from modelward.robustness.attacks.pgd import PGD


class AdversarialConfig(StrictModel):
    """The inner maximisation of eq 5.2 used during training."""

    eps: float = Field(0.1, ge=0.0)
    norm: Literal["linf", "l2"] = "linf"
    alpha: float | None = Field(None, gt=0.0)  # None: 2.5 ε / attack_steps (Madry)
    attack_steps: int = Field(10, ge=1)
    random_start: bool = True
    clip: tuple[float, float] = (0.0, 1.0)
    clean_weight: float = Field(0.0, ge=0.0, le=1.0)  # PGD-AT: loss = (1-w)·ℓ(adv) + w·ℓ(clean)
    beta: float = Field(6.0, ge=0.0)  # TRADES: weight of the KL robustness term

    def step_size(self) -> float:
        return self.alpha if self.alpha is not None else 2.5 * self.eps / self.attack_steps


@dataclass
class AdvTrainResult:
    steps_run: int
    seconds: float
    train_loss: list[tuple[int, float]] = field(default_factory=list)  # (step, mean loss since last record)
    adv_train_accuracy: float = 0.0  # accuracy on the adversarial batches of the last epoch-worth of steps
    test_error: list[tuple[int, float]] = field(default_factory=list)  # clean test error, if test data given


def _loop(model: nn.Module, x_train: torch.Tensor, y_train: torch.Tensor, cfg: TrainConfig, seed: int,
          batch_loss: Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]],
          x_test: torch.Tensor | None, y_test: torch.Tensor | None,
          on_step: Callable[[int, float], None] | None) -> AdvTrainResult:
    t0 = time.perf_counter()
    for p in model.parameters():
        p.requires_grad_(True)
    opt = make_optimizer(list(model.parameters()), cfg)
    batches = batch_order(len(x_train), cfg.batch_size, seed)
    epoch_steps = max(1, len(x_train) // cfg.batch_size)
    res = AdvTrainResult(0, 0.0)
    recent: list[tuple[int, int]] = []  # (correct, n) on adversarial batches
    running, k = 0.0, 0
    dev = model_device(model)  # batches go to the model's device
    model.train()
    for step in range(1, cfg.steps + 1):
        idx = next(batches)
        for g in opt.param_groups:
            g["lr"] = cfg.lr_at(step - 1)
        with autocast(dev, cfg.amp):  # the inner attack runs in autocast too (amp = "bf16" only)
            loss, correct = batch_loss(x_train[idx].to(dev, non_blocking=True),
                                       y_train[idx].to(dev, non_blocking=True), step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        recent.append((int(correct.sum()), len(idx)))
        recent = recent[-epoch_steps:]
        running += loss.item()
        k += 1
        if step % cfg.eval_every == 0 or step == cfg.steps:
            res.train_loss.append((step, running / k))
            running, k = 0.0, 0
            if x_test is not None and y_test is not None:
                res.test_error.append((step, evaluate(model, x_test, y_test, "error", cfg.eval_batch_size)))
                model.train()
        if on_step:
            on_step(step, loss.item())
    res.steps_run = cfg.steps
    res.adv_train_accuracy = sum(c for c, _ in recent) / max(1, sum(n for _, n in recent))
    res.seconds = time.perf_counter() - t0
    return res


def pgd_adversarial_training(model: nn.Module, x_train: torch.Tensor, y_train: torch.Tensor, train_cfg: TrainConfig,
                             adv: AdversarialConfig, seed: int = 0, x_test: torch.Tensor | None = None,
                             y_test: torch.Tensor | None = None,
                             on_step: Callable[[int, float], None] | None = None) -> AdvTrainResult:
    """Madry et al.: every minibatch is replaced by its PGD adversarial examples (eq 5.2).

    Args:
        model: the network to train (in place).
        x_train, y_train: training inputs and labels.
        train_cfg: optimizer, steps, batch size, schedule (:class:`~modelward.core.train.TrainConfig`).
        adv: the adversary (ε, norm, attack steps, step size, clean weight).
        seed: seeds batches and the attack.
        x_test, y_test: optional test set for clean / robust accuracy in the result.
        on_step: called with ``(step, loss)`` after every update.

    Returns:
        :class:`AdvTrainResult` (steps run, adversarial training accuracy, seconds, optional test metrics).

    Example:
        >>> from torch import nn
        >>> from modelward.core.train import TrainConfig
        >>> model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
        >>> x, y = torch.rand(64, 16), torch.randint(3, (64,))
        >>> res = pgd_adversarial_training(model, x, y, TrainConfig(steps=3, batch_size=16), AdversarialConfig(eps=0.1))
        >>> res.steps_run
        3
    """

    def batch_loss(xb: torch.Tensor, yb: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        attack = PGD(model, adv.eps, adv.step_size(), adv.attack_steps, adv.norm, adv.random_start, 1, adv.clip,
                     seed=seed * 1_000_003 + step)
        x_adv = attack(xb, yb).x_adv  # attack_mode restores train mode and parameter grads
        logits = model(x_adv)
        loss = F.cross_entropy(logits, yb)
        if adv.clean_weight > 0:
            loss = (1 - adv.clean_weight) * loss + adv.clean_weight * F.cross_entropy(model(xb), yb)
        return loss, logits.argmax(1) == yb

    return _loop(model, x_train, y_train, train_cfg, seed, batch_loss, x_test, y_test, on_step)


def trades_adversary(model: nn.Module, x: torch.Tensor, adv: AdversarialConfig, gen: torch.Generator) -> torch.Tensor:
    """TRADES inner max: ``max_{x'∈B(x,ε)} KL(f(x) ‖ f(x'))`` by PGD from ``x + 0.001·N(0, I)``."""
    with attack_mode(model):
        with torch.no_grad():
            p_clean = F.softmax(model(x), dim=1)
        # drawn on the CPU generator (the same noise on every device), then moved to the batch's device
        noise = torch.randn(x.shape, generator=gen, dtype=x.dtype, device=gen.device).to(x.device)
        x_adv = (x + 0.001 * noise).clamp(*adv.clip)
        for _ in range(adv.attack_steps):
            x_adv = x_adv.detach().requires_grad_(True)
            with torch.enable_grad():
                kl = F.kl_div(F.log_softmax(model(x_adv), dim=1), p_clean, reduction="sum")
                (g,) = torch.autograd.grad(kl, x_adv)
            with torch.no_grad():
                if adv.norm == "linf":
                    x_adv = project_linf(x_adv + adv.step_size() * g.sign(), x, adv.eps, adv.clip)
                else:
                    x_adv = project_l2(x_adv + adv.step_size() * g / l2_norms(g).clamp_min(1e-12), x, adv.eps,
                                       adv.clip)
    return x_adv.detach()


def trades_training(model: nn.Module, x_train: torch.Tensor, y_train: torch.Tensor, train_cfg: TrainConfig,
                    adv: AdversarialConfig, seed: int = 0, x_test: torch.Tensor | None = None,
                    y_test: torch.Tensor | None = None,
                    on_step: Callable[[int, float], None] | None = None) -> AdvTrainResult:
    """TRADES: ``ℓ(f(x), y) + β · KL(f(x) ‖ f(x_adv))`` with x_adv the KL-maximising point of the ε-ball.

    Args:
        model: the network to train (in place).
        x_train, y_train: training inputs and labels.
        train_cfg: optimizer, steps, batch size, schedule (:class:`~modelward.core.train.TrainConfig`).
        adv: the adversary (ε, norm, attack steps, step size, β).
        seed: seeds batches and the attack.
        x_test, y_test: optional test set for clean / robust accuracy in the result.
        on_step: called with ``(step, loss)`` after every update.

    Returns:
        :class:`AdvTrainResult` (steps run, adversarial training accuracy, seconds, optional test metrics).

    Example:
        >>> from torch import nn
        >>> from modelward.core.train import TrainConfig
        >>> model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
        >>> x, y = torch.rand(64, 16), torch.randint(3, (64,))
        >>> res = trades_training(model, x, y, TrainConfig(steps=3, batch_size=16), AdversarialConfig(eps=0.1))
        >>> res.steps_run
        3
    """
    gen = torch.Generator().manual_seed(seed)

    def batch_loss(xb: torch.Tensor, yb: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x_adv = trades_adversary(model, xb, adv, gen)
        logits = model(xb)
        logits_adv = model(x_adv)
        robust = F.kl_div(F.log_softmax(logits_adv, dim=1), F.softmax(logits, dim=1), reduction="batchmean")
        loss = F.cross_entropy(logits, yb) + adv.beta * robust
        return loss, logits_adv.argmax(1) == yb

    return _loop(model, x_train, y_train, train_cfg, seed, batch_loss, x_test, y_test, on_step)
