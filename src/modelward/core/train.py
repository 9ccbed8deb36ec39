"""Supervised training procedure T (seed 000 §3.1): records the loss curve L(θ_i) at step 0 and every k steps.

A step is one minibatch gradient computation plus update. L is the test top-1 error (default, as in the paper)
or the test cross-entropy. The data order is a seeded permutation per epoch, so two runs with the same seed see
the same batches. Only parameters in ``trainable`` are optimised; every other parameter — and the running
statistics of normalisation layers outside ``trainable`` — stays bit-identical (retraining procedure T2).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer
from torch import nn
from torch.utils.data import Dataset

from modelward.core.config import StrictModel
from modelward.core.data import load_data
from modelward.core.device import AmpSetting, autocast, resolve_device
from modelward.core.init import init_model_
from modelward.core.io import (
    load_into,
    load_metadata,
    load_tensors,
    optimizer_from_tensors,
    optimizer_to_tensors,
    save_tensors,
)
from modelward.core.modules import eval_mode, model_device
from modelward.core.seed import seeded
from modelward.core.zoo import build_model

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
    # "bf16": forward pass and loss of each training step under torch.autocast(bfloat16) (docs/devices.md §5);
    # evaluation stays in full precision
    amp: AmpSetting = "none"

    @model_serializer(mode="wrap")
    def _omit_default_amp(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # "none" is left out of dumps so the fingerprints of studies recorded before `amp` existed still match
        data = handler(self)
        if data.get("amp") == "none":
            data.pop("amp")
        return data

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


def _eval_batches(x: torch.Tensor | Dataset, y: torch.Tensor | None, batch_size: int,
                  workers: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    if isinstance(x, torch.Tensor):
        assert y is not None
        for i in range(0, len(x), batch_size):
            yield x[i : i + batch_size], y[i : i + batch_size]
    else:  # a (lazy) Dataset: read it in order through a DataLoader
        from torch.utils.data import DataLoader

        # its own generator: a DataLoader otherwise draws its base seed from the global RNG (dropout's)
        yield from DataLoader(x, batch_size=batch_size, shuffle=False, num_workers=workers,
                              generator=torch.Generator().manual_seed(0))


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor | Dataset, y: torch.Tensor | None = None,
             metric: LossMetric = "error", batch_size: int = 1024, workers: int = 0) -> float:
    """Test loss L(θ): top-1 error rate or mean cross-entropy, over tensors or a ``Dataset`` (then `y` is None).

    Batches go to the model's device; the loss is accumulated there and read once.
    """
    device = model_device(model)
    total = torch.zeros((), dtype=torch.float64, device=device)
    n = 0
    with eval_mode(model):  # restored per module: some BN layers stay frozen
        for xb, yb in _eval_batches(x, y, batch_size, workers):
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            logits = model(xb)
            if metric == "error":
                total += (logits.argmax(1) != yb).sum()
            else:
                total += F.cross_entropy(logits.float(), yb, reduction="sum").double()
            n += len(yb)
    return float(total.item()) / max(n, 1)


class BatchOrder:
    """Endless seeded minibatch indices: a fresh permutation per epoch, last partial batch dropped if possible.

    The position is part of the state (:meth:`state_dict`), so a run resumed from a mid-run checkpoint draws
    exactly the batches an uninterrupted run would have drawn.
    """

    def __init__(self, n: int, batch_size: int, seed: int) -> None:
        self.n, self.batch_size = n, batch_size
        self.gen = torch.Generator().manual_seed(seed)
        self.usable = n - n % batch_size if n >= batch_size else n
        self._epoch_state = self.gen.get_state()
        self.perm = torch.randperm(n, generator=self.gen)
        self.pos = 0

    def __iter__(self) -> BatchOrder:
        return self

    def __next__(self) -> torch.Tensor:
        if self.pos >= self.usable:
            self._epoch_state = self.gen.get_state()
            self.perm = torch.randperm(self.n, generator=self.gen)
            self.pos = 0
        idx = self.perm[self.pos : self.pos + self.batch_size]
        self.pos += self.batch_size
        return idx

    def state_dict(self) -> dict[str, Any]:
        return {"epoch_state": self._epoch_state.clone(), "pos": self.pos}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.gen.set_state(state["epoch_state"])
        self._epoch_state = state["epoch_state"].clone()
        self.perm = torch.randperm(self.n, generator=self.gen)
        self.pos = int(state["pos"])


def batch_order(n: int, batch_size: int, seed: int) -> Iterator[torch.Tensor]:
    """Endless seeded minibatch indices (see :class:`BatchOrder`)."""
    return BatchOrder(n, batch_size, seed)


@dataclass(frozen=True)
class Checkpointing:
    """Mid-run checkpoints of :func:`train`: every `every` steps the whole training state goes to `path`.

    The state is the model (parameters and buffers, e.g. BatchNorm statistics), the optimizer, the data-order
    position, torch's RNG (dropout), the curve so far and the step. A run started with the same arguments finds the
    file and continues from it; on the CPU the resumed curve is bit-identical to an uninterrupted one. The file
    is safetensors (tensors) + JSON metadata: nothing is unpickled.
    """

    path: Path
    every: int

    def save(self, model: nn.Module, opt: torch.optim.Optimizer, order: BatchOrder, state: dict[str, Any]) -> None:
        opt_tensors, skeleton = optimizer_to_tensors(opt)
        order_state = order.state_dict()
        tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
        tensors.update(opt_tensors)
        tensors["rng.torch"] = torch.get_rng_state()
        tensors["rng.order"] = order_state["epoch_state"]
        meta = {**state, "optimizer": skeleton, "order_pos": order_state["pos"]}
        save_tensors(self.path, tensors, {"modelward_train": json.dumps(meta)})

    def load(self, model: nn.Module, opt: torch.optim.Optimizer, order: BatchOrder) -> dict[str, Any] | None:
        if not Path(self.path).is_file():
            return None
        tensors = load_tensors(self.path)
        meta = json.loads(load_metadata(self.path)["modelward_train"])
        device = model_device(model)
        load_into(model, {k[6:]: v.to(device) for k, v in tensors.items() if k.startswith("model.")}, self.path)
        optimizer_from_tensors(opt, {k: v.to(device) for k, v in tensors.items() if k.startswith("opt.")},
                               meta.pop("optimizer"))
        torch.set_rng_state(tensors["rng.torch"])
        order.load_state_dict({"epoch_state": tensors["rng.order"], "pos": meta.pop("order_pos")})
        return meta


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


def _train_batch(x: torch.Tensor | Dataset, y: torch.Tensor | None, idx: torch.Tensor,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(x, torch.Tensor):
        assert y is not None
        return x[idx].to(device, non_blocking=True), y[idx].to(device, non_blocking=True)
    items = [x[int(i)] for i in idx]  # a lazy Dataset: decode this batch only
    xb = torch.stack([it[0] for it in items])
    yb = torch.as_tensor([int(it[1]) for it in items], dtype=torch.int64)
    return xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)


class _SameOrder(torch.utils.data.Sampler):
    """Batch sampler replaying a copy of the run's :class:`BatchOrder` from its current position, so loader
    workers decode exactly the batches the training loop draws, ahead of it."""

    def __init__(self, order: BatchOrder) -> None:
        self.order = BatchOrder(order.n, order.batch_size, 0)
        self.order.load_state_dict(order.state_dict())

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            yield next(self.order).tolist()


def _prefetching_loader(dataset: Dataset, order: BatchOrder, workers: int) -> Iterator[tuple[torch.Tensor, ...]]:
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_sampler=_SameOrder(order), num_workers=workers, pin_memory=False,
                        generator=torch.Generator().manual_seed(0))
    return iter(loader)


def train(
    model: nn.Module,
    x_train: torch.Tensor | Dataset,
    y_train: torch.Tensor | None,
    x_test: torch.Tensor | Dataset,
    y_test: torch.Tensor | None,
    cfg: TrainConfig,
    seed: int,
    trainable: set[str] | None = None,
    stop_at: float | None = None,
    on_eval: Callable[[int, float], None] | None = None,
    *,
    checkpoint: Checkpointing | None = None,
    workers: int = 0,
) -> TrainResult:
    """Run T: `cfg.steps` SGD/Adam steps; evaluate L at step 0, every `eval_every` steps and at the end.

    `trainable` restricts optimisation to those parameter names (None = all). `stop_at` stops at the first
    evaluation with L ≤ stop_at (used for early stopping of retraining once the α=1 threshold is met).
    Inputs are tensors, or ``torch.utils.data.Dataset`` objects (lazy data; pass None for the labels). Batches go
    to the model's device. With `checkpoint`, the training state is saved every ``checkpoint.every`` steps and a
    run that finds the file resumes from it (bit-identical on the CPU). `workers` > 0 decodes a ``Dataset``'s
    batches in that many loader processes, ahead of the training step (the batches are the same ones).
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

    device = model_device(model)
    batches = BatchOrder(len(x_train), cfg.batch_size, seed)
    resumed = checkpoint.load(model, opt, batches) if checkpoint is not None else None
    if resumed is not None:
        curve = [(int(s), float(v)) for s, v in resumed["curve"]]
        train_loss = [(int(s), float(v)) for s, v in resumed["train_loss"]]
        step, running, stopped = int(resumed["step"]), float(resumed["running"]), bool(resumed["stopped"])
    else:
        curve = [(0, evaluate(model, x_test, y_test, cfg.loss, cfg.eval_batch_size))]
        if on_eval:
            on_eval(0, curve[0][1])
        stopped = stop_at is not None and curve[0][1] <= stop_at
        train_loss = []
        step = 0
        running = 0.0
    prefetch = None
    if workers > 0 and not isinstance(x_train, torch.Tensor) and not stopped:
        prefetch = _prefetching_loader(x_train, batches, workers)
    while not stopped and step < cfg.steps:
        idx = next(batches)  # the order's position is what a checkpoint records
        lr = cfg.lr_at(step)
        for g in opt.param_groups:
            g["lr"] = lr
        if prefetch is not None:
            xb, yb = next(prefetch)
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
        else:
            xb, yb = _train_batch(x_train, y_train, idx, device)
        with autocast(device, cfg.amp):
            loss = F.cross_entropy(model(xb), yb)
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
        if checkpoint is not None and (step % checkpoint.every == 0 or stopped or step == cfg.steps):
            checkpoint.save(model, opt, batches, {"curve": curve, "train_loss": train_loss, "step": step,
                                                  "running": running, "stopped": stopped})
    for p in named.values():
        p.requires_grad_(True)
    return TrainResult(curve, step, stopped and step < cfg.steps, time.perf_counter() - t0, train_loss)


def fit_from_config(data_cfg: object, model_cfg: object, train_cfg: TrainConfig, seed: int = 0,
                    init_scheme: str = "glorot_uniform",
                    on_eval: Callable[[int, float], None] | None = None,
                    device: str | torch.device = "cpu",
                    checkpoint: Checkpointing | None = None) -> tuple[nn.Module, TrainResult, object]:
    """Load the data, build and initialise the zoo model, train it with T on `device` (initialised on the CPU
    first, so the initial weights are the same on every device); returns (model on `device`, result, data).
    With `checkpoint`, the run saves its state every ``checkpoint.every`` steps and resumes from that file."""
    data = load_data(data_cfg)  # type: ignore[arg-type]
    with seeded(seed):  # the zoo constructors draw from the global RNG
        model = init_model_(build_model(model_cfg, data.input_shape, data.num_classes), init_scheme, seed)  # type: ignore[arg-type]
        model.to(resolve_device(device))
        result = train(model, data.x_train, data.y_train, data.x_test, data.y_test, train_cfg, seed, on_eval=on_eval,
                       checkpoint=checkpoint)
    model.eval()
    return model, result, data
