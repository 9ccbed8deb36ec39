"""Where the detectors look inside a model: the penultimate features (the input of the last ``nn.Linear``) and the
last convolutional feature map (what fine-pruning prunes; flattened, the representation the data-level detectors
read by default, ``layer="last_conv"``: it ranks poisoned rows better than the penultimate features on every
BadNets and Blend model of the bench, docs/backdoor.md)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import torch
from torch import nn

from modelward.core.modules import eval_mode, model_device
from modelward.errors import ConfigError

Layer = Literal["penultimate", "last_conv"]
LAYERS: tuple[str, ...] = ("penultimate", "last_conv")


def last_linear(model: nn.Module) -> str:
    """The name of the model's last ``nn.Linear`` (module order); ConfigError when it has none."""
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not names:
        raise ConfigError("backdoor: the model has no nn.Linear layer; penultimate features are read as the input "
                          "of the last one (give a model ending in a linear classifier)")
    return names[-1]


@torch.no_grad()
def penultimate(model: nn.Module, x: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """The input of the model's last ``nn.Linear`` for every row of ``x`` (eval mode), flattened, on the CPU.

    Example:
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
        >>> penultimate(net, torch.zeros(5, 1, 2, 2)).shape
        torch.Size([5, 3])
    """
    layer = dict(model.named_modules())[last_linear(model)]
    feats: list[torch.Tensor] = []
    hook = layer.register_forward_pre_hook(lambda m, inp: feats.append(inp[0].detach().flatten(1).cpu()))
    return _run_hooked(model, x, batch_size, hook, feats)


def last_feature_map(model: nn.Module, sample: torch.Tensor) -> str:
    """The name of the module that produces the model's last 4-D (``N×C×H×W``) output in execution order: the
    last convolutional block, after its activation and pooling (fine-pruning's "last convolutional layer").

    Args:
        model: the network; sample: one or a few inputs to trace a forward pass with.
    """
    order: list[tuple[str, int]] = []
    hooks = [m.register_forward_hook(lambda mod, i, o, n=n: order.append((n, o.dim()))
                                     if isinstance(o, torch.Tensor) else None)
             for n, m in model.named_modules() if n]
    try:
        with torch.no_grad(), eval_mode(model):
            model(sample[:2].to(model_device(model)))
    finally:
        for h in hooks:
            h.remove()
    maps = [n for n, d in order if d == 4]
    if not maps:
        raise ConfigError("backdoor: the model produces no 4-D feature map (N×C×H×W); fine-pruning needs a "
                          "convolutional layer")
    return maps[-1]


@contextmanager
def channel_mask(model: nn.Module, layer: str, keep: torch.Tensor) -> Iterator[None]:
    """Multiply the output channels of ``layer`` by ``keep`` (0 = pruned) for the block."""
    mod = dict(model.named_modules())[layer]
    h = mod.register_forward_hook(lambda m, i, o: o * keep.to(o).view(1, -1, 1, 1))
    try:
        yield
    finally:
        h.remove()


@torch.no_grad()
def channel_activity(model: nn.Module, layer: str, x: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """The mean activation of each output channel of ``layer`` over ``x`` (fine-pruning's pruning order)."""
    mod = dict(model.named_modules())[layer]
    sums: list[torch.Tensor] = []
    h = mod.register_forward_hook(
        lambda m, i, o: sums.append(o.detach().float().mean(dim=(2, 3)).sum(0, keepdim=True).cpu()))
    return _run_hooked(model, x, batch_size, h, sums).sum(0) / max(len(x), 1)


@torch.no_grad()
def last_conv(model: nn.Module, x: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """The output of the model's last convolutional block (:func:`last_feature_map`) for every row of ``x`` (eval
    mode), flattened to ``N × (C·H·W)``, on the CPU.

    Example:
        >>> net = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(32, 2))
        >>> last_conv(net, torch.zeros(5, 1, 4, 4)).shape
        torch.Size([5, 32])
    """
    name = last_feature_map(model, x[:2])
    mod = dict(model.named_modules())[name]
    feats: list[torch.Tensor] = []
    hook = mod.register_forward_hook(lambda m, i, o: feats.append(o.detach().flatten(1).cpu()))
    return _run_hooked(model, x, batch_size, hook, feats)


def representation(model: nn.Module, x: torch.Tensor, layer: str = "last_conv") -> torch.Tensor:
    """The representation the data-level detectors read: ``"last_conv"`` (:func:`last_conv`) or ``"penultimate"``
    (:func:`penultimate`); ConfigError naming the valid choices otherwise."""
    if layer == "last_conv":
        return last_conv(model, x)
    if layer == "penultimate":
        return penultimate(model, x)
    raise ConfigError(f"backdoor: layer {layer!r} is not one of {', '.join(LAYERS)}")


def _run_hooked(model: nn.Module, x: torch.Tensor, batch_size: int, hook: torch.utils.hooks.RemovableHandle,
                feats: list[torch.Tensor]) -> torch.Tensor:
    """Run ``x`` through ``model`` in batches while ``hook`` appends to ``feats``; remove the hook; the rows."""
    dev = model_device(model)
    try:
        with eval_mode(model):
            for i in range(0, len(x), batch_size):
                model(x[i:i + batch_size].to(dev))
    finally:
        hook.remove()
    return torch.cat(feats) if feats else torch.zeros(0)
