"""Slicing a network f = g ∘ h at a named layer (seed 002 §8.3.1, Def. 3.2) without rewriting the model.

``h`` is read with a forward hook on the layer (its output, or its *input* for ``side="input"``); ``g`` is run by
replacing that tensor with a given ``z`` through the same hook (:mod:`modelward.core.slicing`: ``capture`` and
``replace``; ``side`` is its ``anchor``). This works for any ``nn.Module`` whose computation
after the slice depends on the input only through the sliced tensor (chains such as MLPs, small CNNs, GloRo's
``nn.Sequential``); a skip connection around the slice would leak the dummy input into ``g`` and is not supported.
The default slice of the membership attacks is the *input of the last* ``nn.Linear`` (the penultimate features,
on which the top layer is linear, so Alg. 8.1 applies directly).
"""

from __future__ import annotations

import copy
from typing import Literal

import torch
from torch import nn

from modelward.core.init import init_module_
from modelward.core.modules import eval_mode, model_device
from modelward.core.slicing import Cut, capture, replace
from modelward.errors import ConfigError

Side = Literal["input", "output"]


def layer_names(model: nn.Module) -> list[str]:
    """Names of the leaf modules that hold parameters (the slicable layers), in registration order."""
    return [n for n, m in model.named_modules() if not list(m.children()) and
            any(True for _ in m.parameters(recurse=False))]


def last_linear(model: nn.Module) -> str:
    """Name of the last ``nn.Linear`` (the logits layer of every zoo / GloRo model)."""
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not names:
        raise ConfigError(f"{type(model).__name__} has no nn.Linear layer; name a layer to slice at "
                          f"(valid: {layer_names(model)})")
    return names[-1]


def get_layer(model: nn.Module, name: str) -> nn.Module:
    mods = dict(model.named_modules())
    if name not in mods or (not name and list(model.children())):
        raise ConfigError(f"layer {name!r} not in {type(model).__name__}; valid choices: {layer_names(model)}")
    return mods[name]


def _cut(layer: str, side: Side) -> Cut:
    """The core cut of a membership slice: ``side="input"`` is the ``"in"`` anchor, ``"output"`` the ``"out"`` one."""
    return Cut(layer, "in" if side == "input" else "out", field="layer")


@torch.no_grad()
def features(model: nn.Module, layer: str, x: torch.Tensor, side: Side = "input",
             batch_size: int = 1024) -> torch.Tensor:
    """h(x): the tensor entering (``side="input"``) or leaving the layer, flattened per example."""
    mod = get_layer(model, layer)
    cut = _cut(layer, side)
    out: list[torch.Tensor] = []
    with eval_mode(model):
        dev = model_device(model)
        for i in range(0, len(x), batch_size):
            z = capture(model, cut, x[i:i + batch_size].to(dev), mod)
            out.append(z.detach().reshape(len(x[i:i + batch_size]), -1).cpu().clone())
    return torch.cat(out) if out else torch.zeros(0)


class Top(nn.Module):
    """g: the part of ``model`` after the slice, as a module of the flattened sliced features ``z``.

    Args:
        model: the whole network (shared, not copied; use :meth:`fresh_copy` for a trainable proxy top).
        layer: the layer to slice at; ``side`` whether ``z`` is its input or its output.
        input_shape: per-example input shape of ``model`` (a zero dummy input of this shape drives the forward).
        z_shape: per-example shape of the sliced tensor (``z`` is reshaped to it).
    Example:
        >>> top = Top(net, "logits", (64,), (64,))   # g of an MLP sliced before its last layer
        >>> logits = top(z)                           # == net.logits(z)
    """

    def __init__(self, model: nn.Module, layer: str, input_shape: tuple[int, ...], z_shape: tuple[int, ...],
                 side: Side = "input", input_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.model = model
        self.layer = layer
        self.side = side
        self.input_shape = tuple(input_shape)
        self.z_shape = tuple(z_shape)
        # the dummy input's dtype: the model's own (token ids are int64); None: the features' dtype
        self.input_dtype = input_dtype
        get_layer(model, layer)

    @classmethod
    def of(cls, model: nn.Module, layer: str, x_example: torch.Tensor, side: Side = "input") -> Top:
        with torch.no_grad(), eval_mode(model):
            z = capture(model, _cut(layer, side), x_example[:1], get_layer(model, layer))
        return cls(model, layer, tuple(x_example.shape[1:]), tuple(z.shape[1:]), side, x_example.dtype)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        dev = model_device(self.model)
        if z.device != dev:  # features live on the CPU; the model may not
            return self.forward(z.to(dev)).to(z.device)
        zz = z.reshape(len(z), *self.z_shape)
        dummy = torch.zeros((len(z), *self.input_shape), dtype=self.input_dtype or z.dtype, device=z.device)
        return replace(self.model, _cut(self.layer, self.side), zz, dummy, get_layer(self.model, self.layer))

    def after_params(self) -> list[tuple[str, nn.Parameter]]:
        """Parameters of g: those of the sliced layer (input side) / of later layers, in registration order."""
        names = [n for n, _ in self.model.named_modules()]
        start = names.index(self.layer) + (0 if self.side == "input" else 1)
        later = set(names[start:])
        if self.side == "output":  # a child of the sliced layer is still part of h
            later = {n for n in later if not n.startswith(self.layer + ".")}
        return [(n, p) for n, p in self.model.named_parameters() if (n.rsplit(".", 1)[0] if "." in n else "") in later]

    def fresh_copy(self, generator: torch.Generator) -> Top:
        """A copy of g with the same architecture and freshly initialised parameters (a proxy top, Alg. 8.3)."""
        model = copy.deepcopy(self.model)
        top = Top(model, self.layer, self.input_shape, self.z_shape, self.side, self.input_dtype)
        after = {n for n, _ in top.after_params()}
        for n, p in model.named_parameters():
            p.requires_grad_(n in after)
        init_module_(model, "glorot_uniform", generator, param_filter=after)
        return top

    def trainable(self) -> list[nn.Parameter]:
        return [p for _, p in self.after_params()]
