"""Layers for GloRo nets (seed 002 §6.3.2, App. A.4) and an architecture builder in the thesis' notation.

- :class:`MinMax` (Eq. 6.11, GroupSort with groups of 2): sorts adjacent pairs of units; 1-Lipschitz and
  gradient-norm preserving.
- :class:`InvertibleDownsampling` (Anil et al., used in ch. 7): space-to-depth, an isometry.
- :class:`Residual`: ``branch(x) + skip(x)``; its bound is the sum of the branches' bounds (Gouk et al.).
- :func:`build_gloro_model`: ``"c(16,4,2).c(32,4,2).d(100)"`` → an ``nn.Sequential`` whose every layer has a
  known Lipschitz bound, ending in the logit layer (App. A.4 notation: ``c(C, K, S)`` conv, ``d(D)`` dense).
"""

from __future__ import annotations

import re
from typing import Literal

import torch
from torch import nn

from modelward.errors import ConfigError

Activation = Literal["minmax", "relu"]
Init = Literal["glorot", "orthogonal"]

# App. A.4 architectures (the 8C2F list follows App. B.5 / the reference library, see the digest's errata 7).
ARCHITECTURES: dict[str, str] = {
    "2C2F": "c(16,4,2).c(32,4,2).d(100)",
    "4C3F": "c(32,3,1).c(32,4,2).c(64,3,1).c(64,4,2).d(512).d(512)",
    "6C2F": "c(32,3,1).c(32,3,1).c(32,4,2).c(64,3,1).c(64,3,1).c(64,4,2).d(512)",
    "8C2F": "c(64,3,1).c(64,3,1).c(64,4,2).c(128,3,1).c(128,3,1).c(128,4,2).c(256,3,1).c(256,4,2).d(256)",
    "mlp": "d(256).d(256)",
}


class MinMax(nn.Module):
    """MinMax activation (Eq. 6.11): each pair of adjacent channels (dim 1) becomes (min, max).

    The output is a permutation of the input, so the layer is 1-Lipschitz in ℓ2 and its Jacobian is a permutation
    matrix (gradient-norm preserving). Needs an even number of channels.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = x.shape[1]
        if c % 2:
            raise ValueError(f"MinMax needs an even number of channels/units, got {c}")
        pairs = x.unflatten(1, (c // 2, 2))
        a, b = pairs.unbind(2)
        return torch.stack((torch.minimum(a, b), torch.maximum(a, b)), dim=2).flatten(1, 2)


class InvertibleDownsampling(nn.Module):
    """Space-to-depth by a factor 2 (pixel-unshuffle): a permutation of the input, hence Lipschitz 1."""

    def __init__(self, factor: int = 2) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.pixel_unshuffle(x, self.factor)


class Residual(nn.Module):
    """``branch(x) + skip(x)`` (skip defaults to the identity). Lipschitz ≤ L(branch) + L(skip)."""

    def __init__(self, branch: nn.Module, skip: nn.Module | None = None) -> None:
        super().__init__()
        self.branch = branch
        self.skip = skip if skip is not None else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.branch(x) + self.skip(x)


_TOKEN = re.compile(r"^(c)\((\d+),(\d+),(\d+)\)$|^(d)\((\d+)\)$")


def parse_spec(spec: str) -> list[tuple]:
    """``"c(16,4,2).d(100)"`` → ``[("c", 16, 4, 2), ("d", 100)]``; an architecture name is expanded first."""
    spec = ARCHITECTURES.get(spec, spec)
    out: list[tuple] = []
    for tok in spec.replace(" ", "").split("."):
        if not tok:
            continue
        m = _TOKEN.match(tok)
        if not m:
            raise ConfigError(
                f"model.arch: cannot parse layer {tok!r} in {spec!r}; use c(channels,kernel,stride) and d(units) "
                f"joined by '.', or one of {sorted(ARCHITECTURES)}"
            )
        if m.group(1):
            out.append(("c", int(m.group(2)), int(m.group(3)), int(m.group(4))))
        else:
            out.append(("d", int(m.group(6))))
    if not out:
        raise ConfigError(f"model.arch: empty architecture {spec!r}")
    return out


def _act(kind: Activation) -> nn.Module:
    return MinMax() if kind == "minmax" else nn.ReLU()


def build_gloro_model(spec: str, input_shape: tuple[int, ...], num_classes: int, activation: Activation = "minmax",
                      init: Init = "glorot", seed: int = 0) -> nn.Sequential:
    """Build ``spec`` (App. A.4 notation) for ``input_shape`` with an activation after every layer but the logits.

    Convolutions use zero padding ``(K-1)//2`` (so stride 1 keeps the size and ``c(·,4,2)`` halves it); no
    BatchNorm (incompatible with GloRo training, §6.3.2). ``init``: Glorot uniform ("default") or orthogonal.
    """
    layers = parse_spec(spec)
    if len(input_shape) not in (1, 3):
        raise ConfigError(f"model: input shape {input_shape} must be C×H×W (images) or D (tabular)")
    if len(input_shape) == 1 and any(t[0] == "c" for t in layers):
        raise ConfigError(f"model.arch {spec!r} has convolutions but the data are tabular {input_shape}")
    if activation == "minmax" and any((t[1] % 2) for t in layers):
        raise ConfigError(f"model.arch {spec!r}: MinMax needs even channel/unit counts")
    g = torch.Generator().manual_seed(seed)
    mods: list[nn.Module] = []
    shape = tuple(input_shape)
    flat = len(shape) == 1
    for t in layers:
        if t[0] == "c":
            if flat:
                raise ConfigError(f"model.arch {spec!r}: a convolution cannot follow a dense layer")
            _, cout, k, s = t
            conv = nn.Conv2d(shape[0], cout, k, s, (k - 1) // 2)
            mods += [conv, _act(activation)]
            h = (shape[1] + 2 * ((k - 1) // 2) - k) // s + 1
            w = (shape[2] + 2 * ((k - 1) // 2) - k) // s + 1
            if h < 1 or w < 1:
                raise ConfigError(f"model.arch {spec!r}: the feature map vanishes for input {input_shape}")
            shape = (cout, h, w)
        else:
            if not flat:
                mods.append(nn.Flatten())
                shape = (shape[0] * shape[1] * shape[2],)
                flat = True
            mods += [nn.Linear(shape[0], t[1]), _act(activation)]
            shape = (t[1],)
    if not flat:
        mods.append(nn.Flatten())
        shape = (shape[0] * shape[1] * shape[2],)
    mods.append(nn.Linear(shape[0], num_classes))
    model = nn.Sequential(*mods)
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            if init == "orthogonal":
                nn.init.orthogonal_(m.weight, generator=g)
            else:
                nn.init.xavier_uniform_(m.weight, generator=g)
            nn.init.zeros_(m.bias)
    return model
