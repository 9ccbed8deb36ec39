"""Shadow, proxy and reference models: the training algorithm A of Threat Model 8.1 and many small copies of it.

:class:`ModelTrainer` is "A incl. hyperparameters": a model factory (the zoo architecture of the target) and a
:class:`~modelward.core.train.TrainConfig`. :func:`train_stacked` trains K models of one architecture on K index
sets *together*: the K parameter sets are stacked (``torch.func.stack_module_state``) and one vmapped
``functional_call`` computes all K losses per step. The summed loss has block-separable gradients and SGD (with
momentum / weight decay) and Adam update element-wise, so this is exactly K independent trainings (same inits, same
per-model batch order ``core.train.batch_order(n_k, batch, seed_k)``) up to float summation order; models with
batch-norm buffers fall back to the loop. :class:`ShadowPool` records which pool points each model was trained on
(LiRA / RMIA / shadow-bb reuse one pool).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from modelward.core.device import DeviceSetting, resolve_device
from modelward.core.init import init_model_
from modelward.core.io import load_into, load_state_dict, save_state_dict
from modelward.core.modules import batched_logits, model_device
from modelward.core.train import TrainConfig, batch_order, make_optimizer, train
from modelward.core.zoo import MLP
from modelward.errors import DataError

Factory = Callable[[], nn.Module]


def _no_buffers(model: nn.Module) -> bool:
    return not any(True for _ in model.buffers())


def _stackable(model: nn.Module) -> bool:
    """No buffers (batch norm) and no forward hooks (e.g. dropout hooks): the stacked math is then exact."""
    hooked = any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())
    return _no_buffers(model) and not hooked


def fit(model: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: TrainConfig, seed: int,
        trainable: set[str] | None = None) -> nn.Module:
    """Train ``model`` in place with core.train's procedure T (no periodic test evaluation) and return it in eval."""
    lean = cfg.model_copy(update={"eval_every": cfg.steps})
    train(model, x, y, x[:1], y[:1], lean, seed, trainable=trainable)
    model.eval()
    return model


@dataclass
class ModelTrainer:
    """The training algorithm A: ``factory()`` builds a fresh architecture, ``cfg`` the hyper-parameters.

    Example:
        >>> t = ModelTrainer(lambda: build_model(ModelConfig(arch="mlp", hidden=[60]), (30,), 2), TrainConfig())
        >>> shadow = t.train(x_holdout[:100], y_holdout[:100], seed=1)
    """

    factory: Factory
    cfg: TrainConfig
    init_scheme: str = "glorot_uniform"
    # where the models train (docs/devices.md): initialised on the CPU, trained on the device, handed back on the
    # CPU (the attacks score them there)
    device: DeviceSetting = "cpu"

    def build(self, seed: int) -> nn.Module:
        return init_model_(self.factory(), self.init_scheme, seed)

    def train(self, x: torch.Tensor, y: torch.Tensor, seed: int) -> nn.Module:
        return fit(self.build(seed).to(resolve_device(self.device)), x, y, self.cfg, seed).cpu()

    def train_many(self, x: torch.Tensor, y: torch.Tensor, index_sets: Sequence[np.ndarray], seeds: Sequence[int],
                   stacked: bool = True) -> list[nn.Module]:
        """K models, model k on ``x[index_sets[k]]`` with seed ``seeds[k]`` (stacked when exact, else a loop)."""
        dev = resolve_device(self.device)
        models = [self.build(s).to(dev) for s in seeds]
        if stacked and models and _stackable(models[0]):
            return [m.cpu() for m in train_stacked(models, x, y, index_sets, self.cfg, seeds)]
        return [fit(m, x[torch.as_tensor(ix)], y[torch.as_tensor(ix)], self.cfg, s).cpu()
                for m, ix, s in zip(models, index_sets, seeds, strict=True)]


def train_loop(models: list[nn.Module], x: torch.Tensor, y: torch.Tensor, index_sets: Sequence[np.ndarray],
               cfg: TrainConfig, seeds: Sequence[int]) -> list[nn.Module]:
    """The reference: K separate plain training loops (same math as :func:`train_stacked`)."""
    out = []
    for m, ix, s in zip(models, index_sets, seeds, strict=True):
        dev = model_device(m)  # the data of model k goes to its device
        xi, yi = x[torch.as_tensor(ix)].to(dev), y[torch.as_tensor(ix)].to(dev)
        opt = make_optimizer(list(m.parameters()), cfg)
        order = batch_order(len(xi), cfg.batch_size, s)
        m.train()
        for step in range(cfg.steps):
            for g in opt.param_groups:
                g["lr"] = cfg.lr_at(step)
            idx = next(order)
            loss = F.cross_entropy(m(xi[idx]), yi[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        m.eval()
        out.append(m)
    return out


def train_stacked(models: list[nn.Module], x: torch.Tensor, y: torch.Tensor, index_sets: Sequence[np.ndarray],
                  cfg: TrainConfig, seeds: Sequence[int]) -> list[nn.Module]:
    """Train K same-architecture, buffer-free models together (vmap over stacked parameters); exact per model.

    Args:
        models: K initialised models (their parameters are the initial values; they are updated in place).
        x, y: the data pool; ``index_sets[k]`` the rows model k trains on (sizes may differ).
        cfg: TrainConfig (optimizer, lr schedule, momentum, weight decay, batch size, steps).
        seeds: per-model batch-order seeds (``core.train.batch_order``), as in :func:`train_loop`.
    Returns:
        the same model objects, trained, in eval mode.
    """
    if not models:
        return []
    if any(not _no_buffers(m) for m in models):
        raise DataError("train_stacked: models with buffers (batch norm) cannot be stacked exactly; use the loop")
    K = len(models)
    leaves = {n: torch.stack([dict(m.named_parameters())[n].detach() for m in models]).requires_grad_(True)
              for n, _ in models[0].named_parameters()}
    chain = _linear_chain(models[0])
    if chain is None:  # torch.func is imported only here: its first import costs seconds (sympy)
        from torch.func import functional_call, vmap
    base = copy.deepcopy(models[0]).to("meta")
    opt = make_optimizer(list(leaves.values()), cfg)
    idx_sets = [torch.as_tensor(np.asarray(ix), dtype=torch.long) for ix in index_sets]
    bs = [min(cfg.batch_size, len(ix)) for ix in idx_sets]
    orders = [batch_order(len(ix), cfg.batch_size, s) for ix, s in zip(idx_sets, seeds, strict=True)]

    def one(p: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(base, p, (xb,)), yb)

    if chain is not None:  # stacked MLP: one baddbmm per layer (vmap's per-call overhead dominates tiny models)
        names = chain

        def batched(p: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
            h = xb.flatten(2)
            for i, n in enumerate(names):
                pre = f"{n}." if n else ""
                h = torch.baddbmm(p[f"{pre}bias"][:, None, :], h, p[f"{pre}weight"].transpose(1, 2))
                if i < len(names) - 1:
                    h = torch.relu(h)
            return F.cross_entropy(h.reshape(-1, h.shape[-1]), yb.reshape(-1), reduction="none").view(
                yb.shape).mean(1)
    else:
        batched = vmap(one)
    same_batch = len(set(bs)) == 1
    dev = next(iter(leaves.values())).device  # the models' device: each step's batches go there
    for step in range(cfg.steps):
        for g in opt.param_groups:
            g["lr"] = cfg.lr_at(step)
        rows = [ix[next(o)] for ix, o in zip(idx_sets, orders, strict=True)]
        if same_batch:
            sel = torch.stack(rows)
            losses = batched(leaves, x[sel].to(dev), y[sel].to(dev))
        else:  # unequal batch sizes (a set smaller than the batch): per-model calls, still one optimizer step
            losses = torch.stack([one({k: v[i] for k, v in leaves.items()}, x[r].to(dev), y[r].to(dev))
                                  for i, r in enumerate(rows)])
        opt.zero_grad(set_to_none=True)
        losses.sum().backward()
        opt.step()
    with torch.no_grad():
        for i, m in enumerate(models):
            for name, p in m.named_parameters():
                p.copy_(leaves[name][i])
            m.eval()
    assert len(models) == K
    return models


def _linear_chain(model: nn.Module) -> list[str] | None:
    """Layer names if ``model`` is a zoo MLP (flatten → (Linear → ReLU)* → Linear) or one Linear, else None."""
    if type(model) is nn.Linear and model.bias is not None:
        return [""]
    if type(model) is MLP:
        return [f"fc{i}" for i in range(1, model.n_hidden + 1)] + ["logits"]
    return None


@dataclass
class ShadowPool:
    """K shadow models over a pool of points; ``masks[k, i]`` = pool point i was in model k's training set."""

    models: list[nn.Module]
    x_pool: torch.Tensor
    y_pool: torch.Tensor
    masks: np.ndarray

    @classmethod
    def train(cls, trainer: ModelTrainer, x_pool: torch.Tensor, y_pool: torch.Tensor, count: int,
              fraction: float = 0.5, seed: int = 0, stacked: bool = True) -> ShadowPool:
        """``count`` shadows, each on a random ``fraction`` of the pool; with fraction ½ every point is IN for
        exactly half of the models (Carlini et al.'s paired design) when ``count`` is even."""
        rng = np.random.default_rng(seed)
        n = len(x_pool)
        masks = np.zeros((count, n), dtype=bool)
        if fraction == 0.5 and count % 2 == 0:
            for k in range(0, count, 2):
                perm = rng.permutation(n)
                masks[k, perm[: n // 2]] = True
                masks[k + 1, perm[n // 2:]] = True
        else:
            m = max(1, int(round(fraction * n)))
            for k in range(count):
                masks[k, rng.choice(n, m, replace=False)] = True
        sets = [np.nonzero(mk)[0] for mk in masks]
        models = trainer.train_many(x_pool, y_pool, sets, [seed * 10_007 + k for k in range(count)], stacked)
        return cls(models, x_pool, y_pool, masks)

    def lookup(self, x: torch.Tensor) -> np.ndarray:
        """Pool index of each row of ``x`` (−1 if the row is not in the pool), matched on exact bytes."""
        table = {bytes(r.numpy().tobytes()): i for i, r in enumerate(self.x_pool.reshape(len(self.x_pool), -1))}
        return np.array([table.get(bytes(r.numpy().tobytes()), -1) for r in x.reshape(len(x), -1)], dtype=np.int64)

    def save(self, path: str | Path) -> None:
        tensors = {f"m{k}.{n}": v for k, m in enumerate(self.models) for n, v in m.state_dict().items()}
        tensors |= {"x_pool": self.x_pool, "y_pool": self.y_pool, "masks": torch.as_tensor(self.masks)}
        save_state_dict(path, tensors, {"count": len(self.models)})

    @classmethod
    def load(cls, path: str | Path, factory: Factory) -> ShadowPool:
        tensors, meta = load_state_dict(path)
        models = []
        for k in range(int(meta["count"])):
            m = factory()
            load_into(m, {n[len(f"m{k}."):]: v for n, v in tensors.items() if n.startswith(f"m{k}.")}, f"{path} (m{k}.*)")
            models.append(m.eval())
        return cls(models, tensors["x_pool"], tensors["y_pool"], tensors["masks"].numpy().astype(bool))


@torch.no_grad()
def logits_of(model: nn.Module, x: torch.Tensor, batch_size: int = 2048) -> torch.Tensor:
    """Eval-mode logits on the model's device, returned on the CPU (the attacks' numpy side)."""
    return batched_logits(model, x, batch_size)
