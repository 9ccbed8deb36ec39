"""Initialisation schemes used when a part is reset (seed 000 §3.3, T4).

- ``glorot_uniform`` (default, T1): U(−a, a), a = sqrt(6 / (fan_in + fan_out))  (Glorot & Bengio 2010)
- ``glorot_normal``: N(0, 2 / (fan_in + fan_out))
- ``msra``: N(0, 2 / fan_in)  (He et al. 2015, ReLU gain)
- ``caffe``: Caffe's default "xavier" filler, U(−a, a) with a = sqrt(3 / fan_in)
Biases are zeroed; normalisation layers get weight 1, bias 0 and fresh running statistics. A module with its own
rule (e.g. a noisy linear layer, whose noise scales are not weights) defines ``init_own_(scheme, generator, names)``
and is initialised by it.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

InitScheme = Literal["glorot_uniform", "glorot_normal", "msra", "caffe"]
INIT_SCHEMES: tuple[str, ...] = ("glorot_uniform", "glorot_normal", "msra", "caffe")


def _fans(w: torch.Tensor) -> tuple[int, int]:
    fan_in, fan_out = nn.init._calculate_fan_in_and_fan_out(w)
    return max(fan_in, 1), max(fan_out, 1)


@torch.no_grad()
def init_weight_(w: torch.Tensor, scheme: str, generator: torch.Generator | None = None) -> None:
    """Fill a weight tensor (dim >= 2) in place with `scheme`."""
    fan_in, fan_out = _fans(w)
    if scheme == "glorot_uniform":
        a = math.sqrt(6.0 / (fan_in + fan_out))
        w.uniform_(-a, a, generator=generator)
    elif scheme == "glorot_normal":
        w.normal_(0.0, math.sqrt(2.0 / (fan_in + fan_out)), generator=generator)
    elif scheme == "msra":
        w.normal_(0.0, math.sqrt(2.0 / fan_in), generator=generator)
    elif scheme == "caffe":
        a = math.sqrt(3.0 / fan_in)
        w.uniform_(-a, a, generator=generator)
    else:
        raise ValueError(f"unknown init scheme {scheme!r}; valid choices: {INIT_SCHEMES}")


_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm)


@torch.no_grad()
def init_module_(module: nn.Module, scheme: str = "glorot_uniform", generator: torch.Generator | None = None,
                 param_filter: set[str] | None = None, prefix: str = "") -> None:
    """Re-initialise the parameters of `module` (only those whose full name is in `param_filter`, if given)."""
    for name, sub in module.named_modules(prefix=prefix):
        own = list(sub.named_parameters(recurse=False))
        selected = [(n, p) for n, p in own if param_filter is None or f"{name}.{n}".lstrip(".") in param_filter]
        if not selected:
            continue
        own_rule = getattr(sub, "init_own_", None)
        if callable(own_rule):
            own_rule(scheme, generator, {n for n, _ in selected})
            continue
        if isinstance(sub, _NORMS):
            for n, p in selected:
                p.fill_(1.0 if n == "weight" else 0.0)
            if isinstance(sub, nn.modules.batchnorm._BatchNorm) and sub.track_running_stats:
                sub.reset_running_stats()
            continue
        for _n, p in selected:
            if p.dim() >= 2:
                if isinstance(sub, nn.LSTM | nn.GRU | nn.RNN):
                    # one gate block at a time so fans match the per-gate matrices
                    for chunk in p.chunk(4 if isinstance(sub, nn.LSTM) else (3 if isinstance(sub, nn.GRU) else 1)):
                        init_weight_(chunk, scheme, generator)
                else:
                    init_weight_(p, scheme, generator)
            else:
                p.zero_()


def init_model_(model: nn.Module, scheme: str = "glorot_uniform", seed: int = 0) -> nn.Module:
    """Initialise every parameter of `model` deterministically from `seed`."""
    g = torch.Generator().manual_seed(seed)
    init_module_(model, scheme, g)
    return model
