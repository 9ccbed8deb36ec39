"""Training GloRo nets (seed 002 App. A.4 / B.5): Adam, ε and TRADES-λ schedules, ``decay_to`` learning rate,
optional warm-up with plain cross-entropy, a few power iterations per step and a converged refresh per epoch.

``loss="standard"`` trains the underlying model with plain cross-entropy (the "standard†" rows of Table 6.7), so
one loop serves both the baseline and the certified nets.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from modelward.core.config import StrictModel
from modelward.core.device import AmpSetting, autocast, model_device
from modelward.core.train import batch_order
from modelward.robustness.gloro.losses import gloro_cross_entropy, gloro_trades_loss
from modelward.robustness.gloro.net import GloroNet
from modelward.robustness.gloro.schedules import Schedule, ScheduleKind, decay_to

GloroLoss = Literal["standard", "crossentropy", "trades_kl", "trades_ce"]


class GloroTrainConfig(StrictModel):
    """Hyper-parameters (names follow App. A.4, Table A.3)."""

    epochs: int = Field(100, ge=1)
    batch_size: int = Field(256, ge=1)
    lr: float = Field(1e-3, gt=0.0)
    lr_decay_to: float | None = Field(1e-6, gt=0.0)  # decay_to_lb from half-way; None = constant
    epsilon: float = Field(0.3, ge=0.0)  # ε_train
    epsilon_schedule: ScheduleKind = "single"
    epsilon_start: float = Field(0.0, ge=0.0)
    epsilon_until: float = Field(0.5, gt=0.0, le=1.0)
    loss: GloroLoss = "trades_kl"
    trades_lambda: Schedule = Field(default_factory=lambda: Schedule(kind="single", end=1.5))
    power_iterations: int = Field(5, ge=1)
    warmup_epochs: int = Field(0, ge=0)
    refresh_tol: float = Field(1e-5, gt=0.0)
    # "bf16": the underlying model's forward pass under torch.autocast(bfloat16); the Lipschitz bound, the ⊥
    # logit and the loss stay in float32 (a bf16 bound would not be sound), and certification never uses amp
    amp: AmpSetting = "none"

    @model_serializer(mode="wrap")
    def _omit_default_amp(self, handler: SerializerFunctionWrapHandler) -> dict:
        data = handler(self)  # "none" is left out so configs/checkpoints recorded before `amp` still match
        if data.get("amp") == "none":
            data.pop("amp")
        return data

    def epsilon_at(self, t: float) -> float:
        return Schedule(kind=self.epsilon_schedule, start=self.epsilon_start, end=self.epsilon,
                        until=self.epsilon_until).at(t, self.epochs)


@dataclass
class GloroTrainResult:
    history: list[dict[str, float]] = field(default_factory=list)  # one row per epoch
    seconds: float = 0.0


def train_gloro(net: GloroNet, x: torch.Tensor, y: torch.Tensor, cfg: GloroTrainConfig, seed: int = 0,
                on_epoch: Callable[[dict[str, float]], None] | None = None, start_epoch: int = 0,
                optimizer: torch.optim.Optimizer | None = None) -> GloroTrainResult:
    """Train ``net.f`` (and so the GloRo net) for ``cfg.epochs`` epochs from ``start_epoch``, on the device of
    ``net.f`` (batches of `x`, `y` are moved there)."""
    opt = optimizer or torch.optim.Adam(net.f.parameters(), lr=cfg.lr, eps=1e-7)
    n = len(x)
    per_epoch = max(1, n // cfg.batch_size) if n >= cfg.batch_size else 1
    batches = batch_order(n, cfg.batch_size, seed + 7919 * start_epoch)
    res = GloroTrainResult()
    dev = model_device(net.f)
    t_all = time.perf_counter()
    for epoch in range(start_epoch, cfg.epochs):
        net.train()
        t0 = time.perf_counter()
        total = 0.0
        for b in range(per_epoch):
            t = epoch + b / per_epoch
            lr = decay_to(cfg.lr, cfg.lr_decay_to, t, cfg.epochs) if cfg.lr_decay_to else cfg.lr
            for grp in opt.param_groups:
                grp["lr"] = lr
            idx = next(batches)
            xb, yb = x[idx].to(dev, non_blocking=True), y[idx].to(dev, non_blocking=True)
            net.epsilon = cfg.epsilon_at(t)
            lam = cfg.trades_lambda.at(t, cfg.epochs)
            if cfg.loss == "standard" or epoch < cfg.warmup_epochs:
                with autocast(dev, cfg.amp):
                    loss = F.cross_entropy(net.f(xb), yb)
            else:
                with autocast(dev, cfg.amp):
                    logits = net.f(xb)
                logits = logits.float()  # the bound and the ⊥ logit are computed in float32, outside autocast
                K = net.margin_lipschitz(cfg.power_iterations)
                gl = torch.cat([logits, net.bottom(logits, K)[:, None]], 1)
                if cfg.loss == "crossentropy":
                    loss = gloro_cross_entropy(gl, yb)
                else:
                    loss = gloro_trades_loss(logits, gl, yb, lam, "kl" if cfg.loss == "trades_kl" else "ce")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += float(loss.detach())
        if cfg.loss != "standard":
            net.sub.converge(cfg.refresh_tol)
        row = {"epoch": epoch + 1, "loss": total / per_epoch, "epsilon": net.epsilon, "lr": lr,
               "lambda": cfg.trades_lambda.at(epoch + 1, cfg.epochs), "seconds": time.perf_counter() - t0}
        res.history.append(row)
        if on_epoch:
            on_epoch(row)
    net.epsilon = cfg.epsilon_at(cfg.epochs)
    net.eval()
    res.seconds = time.perf_counter() - t_all
    return res
