"""Supervised training procedure T (seed 000 §3.1): records the loss curve L(θ_i) at step 0 and every k steps.

A step is one minibatch gradient computation plus update. L is the test top-1 error (default, as in the paper)
or the test cross-entropy. The data order is a seeded permutation per epoch, so two runs with the same seed see
the same batches. Only parameters in ``trainable`` are optimised; every other parameter — and the running
statistics of normalisation layers outside ``trainable`` — stays bit-identical (retraining procedure T2).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, field_validator
from torch import nn

from modelward.core.config import StrictModel

LossMetric = Literal["error", "cross_entropy"]


class TrainConfig(StrictModel):
    """Hyper-parameters of a training procedure (seed 000 App. A: momentum SGD, ℓ2 1e-4, step LR schedule)."""

    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = Field(0.05, gt=0.0)
    momentum: float = Field(0.9, ge=0.0, lt=1.0)
    weight_decay: float = Field(1e-4, ge=0.0)
    batch_size: int = Field(64, ge=1)
    steps: int = Field(600, ge=1)
    lr_schedule: list[tuple[int, float]] = Field(default_factory=list)  # [(from_step, lr), ...]; empty = constant
    eval_every: int = Field(20, ge=1)
    loss: LossMetric = "error"
    eval_batch_size: int = Field(1024, ge=1)

    @field_validator("lr_schedule")
    @classmethod
    def _sorted(cls, v: list[tuple[int, float]]) -> list[tuple[int, float]]:
        steps = [s for s, _ in v]
        if steps != sorted(steps) or len(set(steps)) != len(steps):
            raise ValueError("boundaries must be strictly increasing steps, e.g. [[0, 0.05], [300, 0.005]]")
        if any(lr <= 0 for _, lr in v):
            raise ValueError("learning rates must be > 0")
        return v

    def lr_at(self, step: int) -> float:
        lr = self.lr
        for boundary, value in self.lr_schedule:
            if step >= boundary:
                lr = value
        return lr


@dataclass
class TrainResult:
    """The recorded curve [(step, L)] and bookkeeping."""

    curve: list[tuple[int, float]]
    steps_run: int
    stopped_early: bool
    seconds: float
    train_loss: list[tuple[int, float]] = field(default_factory=list)


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, metric: LossMetric = "error",
             batch_size: int = 1024) -> float:
    """Test loss L(θ): top-1 error rate or mean cross-entropy."""
    modes = [(m, m.training) for m in model.modules()]  # restore per module: some BN layers stay frozen
    model.eval()
    total, n = 0.0, len(x)
    for i in range(0, n, batch_size):
        logits = model(x[i : i + batch_size])
        yb = y[i : i + batch_size]
        if metric == "error":
            total += (logits.argmax(1) != yb).sum().item()
        else:
            total += F.cross_entropy(logits, yb, reduction="sum").item()
    for m, mode in modes:
        m.training = mode
    return total / n


def batch_order(n: int, batch_size: int, seed: int) -> Iterator[torch.Tensor]:
    """Endless seeded minibatch indices: a fresh permutation per epoch, last partial batch dropped if possible."""
    g = torch.Generator().manual_seed(seed)
    while True:
        perm = torch.randperm(n, generator=g)
        usable = n - n % batch_size if n >= batch_size else n
        for i in range(0, usable, batch_size):
            yield perm[i : i + batch_size]


def make_optimizer(params: list[nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr_at(0), momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    return torch.optim.Adam(params, lr=cfg.lr_at(0), weight_decay=cfg.weight_decay)


def _freeze_foreign_norms(model: nn.Module, trainable: set[str]) -> list[nn.Module]:
    """Put norm layers with no trainable parameter in eval mode so their running statistics do not move."""
    frozen = []
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            own = {f"{name}.{n}" for n, _ in m.named_parameters(recurse=False)}
            if not own & trainable:
                m.eval()
                frozen.append(m)
    return frozen


def train(
    model: nn.Module,
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    cfg: TrainConfig,
    seed: int,
    trainable: set[str] | None = None,
    stop_at: float | None = None,
    on_eval: Callable[[int, float], None] | None = None,
) -> TrainResult:
    """Run T: `cfg.steps` SGD/Adam steps; evaluate L at step 0, every `eval_every` steps and at the end.

    `trainable` restricts optimisation to those parameter names (None = all). `stop_at` stops at the first
    evaluation with L ≤ stop_at (used for early stopping of retraining once the α=1 threshold is met).
    """
    t0 = time.perf_counter()
    named = dict(model.named_parameters())
    names = set(named) if trainable is None else set(trainable)
    unknown = names - set(named)
    if unknown:
        raise ValueError(f"unknown trainable parameters: {sorted(unknown)[:5]}")
    for n, p in named.items():
        p.requires_grad_(n in names)
    params = [named[n] for n in named if n in names]
    opt = make_optimizer(params, cfg)
    model.train()
    if trainable is not None:
        _freeze_foreign_norms(model, names)

    curve = [(0, evaluate(model, x_test, y_test, cfg.loss, cfg.eval_batch_size))]
    if on_eval:
        on_eval(0, curve[0][1])
    stopped = stop_at is not None and curve[0][1] <= stop_at
    train_loss: list[tuple[int, float]] = []
    step = 0
    batches = batch_order(len(x_train), cfg.batch_size, seed)
    running = 0.0
    while not stopped and step < cfg.steps:
        idx = next(batches)
        lr = cfg.lr_at(step)
        for g in opt.param_groups:
            g["lr"] = lr
        loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        running += loss.item()
        if step % cfg.eval_every == 0 or step == cfg.steps:
            val = evaluate(model, x_test, y_test, cfg.loss, cfg.eval_batch_size)
            curve.append((step, val))
            k = cfg.eval_every if step % cfg.eval_every == 0 else step % cfg.eval_every
            train_loss.append((step, running / k))
            running = 0.0
            if on_eval:
                on_eval(step, val)
            if stop_at is not None and val <= stop_at:
                stopped = True
    for p in named.values():
        p.requires_grad_(True)
    return TrainResult(curve, step, stopped and step < cfg.steps, time.perf_counter() - t0, train_loss)


def fit_from_config(data_cfg: object, model_cfg: object, train_cfg: TrainConfig, seed: int = 0,
                    init_scheme: str = "glorot_uniform",
                    on_eval: Callable[[int, float], None] | None = None) -> tuple[nn.Module, TrainResult, object]:
    """Load the data, build and initialise the zoo model, train it with T; returns (model, result, data)."""
    from modelward.core.data import load_data
    from modelward.core.init import init_model_
    from modelward.core.zoo import build_model

    data = load_data(data_cfg)  # type: ignore[arg-type]
    torch.manual_seed(seed)
    model = init_model_(build_model(model_cfg, data.input_shape, data.num_classes), init_scheme, seed)  # type: ignore[arg-type]
    result = train(model, data.x_train, data.y_train, data.x_test, data.y_test, train_cfg, seed, on_eval=on_eval)
    model.eval()
    return model, result, data
