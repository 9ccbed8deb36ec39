"""Defensive distillation (Papernot et al. 2016; seed 004 §2.3.1 and the temperature softmax of eq 5.5).

A teacher is trained with ``softmax(z / T)``; a student of the same architecture is trained at the same T on the
teacher's soft labels ``S(z)_i = e^{z_i/T} / Σ_j e^{z_j/T}`` and deployed at T = 1 (its raw logits). The deployed
logits are ~T times larger, which saturates the softmax and flattens cross-entropy gradients — so gradient attacks
on the cross-entropy (FGSM/PGD) weaken, while C&W, which works on logit margins, still succeeds (the thesis's
footnote to [4]).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from modelward.core.device import model_device
from modelward.core.seed import seeded
from modelward.core.train import TrainConfig, batch_order, make_optimizer
from modelward.errors import ConfigError


@dataclass
class DistillationResult:
    teacher: nn.Module
    student: nn.Module
    temperature: float
    teacher_loss: float
    student_loss: float


def train_at_temperature(model: nn.Module, x: torch.Tensor, targets: torch.Tensor, cfg: TrainConfig,
                         temperature: float, seed: int) -> float:
    """Cross-entropy of ``softmax(model(x) / T)`` against hard labels (1-D) or soft labels (2-D); last-batch loss."""
    model.train()
    opt = make_optimizer(list(model.parameters()), cfg)
    batches = batch_order(len(x), cfg.batch_size, seed)
    dev = model_device(model)  # batches go to the model's device
    loss = torch.zeros((), device=dev)
    for step in range(cfg.steps):
        idx = next(batches)
        for g in opt.param_groups:
            g["lr"] = cfg.lr_at(step)
        logp = F.log_softmax(model(x[idx].to(dev)) / temperature, dim=1)
        t = targets[idx].to(dev)
        loss = F.nll_loss(logp, t) if t.dim() == 1 else -(t * logp).sum(1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()
    return float(loss.item())


def defensive_distillation(build: Callable[[], nn.Module], x: torch.Tensor, y: torch.Tensor, cfg: TrainConfig,
                           temperature: float = 20.0, seed: int = 0) -> DistillationResult:
    """Train teacher and student at temperature T; the returned student is used at T = 1."""
    if temperature <= 0:
        raise ConfigError(f"distillation: temperature must be > 0, got {temperature}")
    with seeded(seed):  # build() draws the initial weights from the global RNG
        teacher = build()
        t_loss = train_at_temperature(teacher, x, y, cfg, temperature, seed)
    with torch.no_grad():
        soft = F.softmax(teacher(x.to(model_device(teacher))) / temperature, dim=1)
    with seeded(seed + 1):
        student = build()
        s_loss = train_at_temperature(student, x, soft, cfg, temperature, seed + 1)
    return DistillationResult(teacher, student, temperature, t_loss, s_loss)
