"""Cutting a network f = g ∘ h at a named module, without rewriting the model (seed 002 §3.1, Def. 3.1).

A :class:`Cut` names a module and an ``anchor``: ``"out"`` — z is the module's output — or ``"in"`` — z is its
(first) input (TruLens' ``Cut(name, anchor)``). Three operations are built on one forward hook:

- :func:`intercept`: a context manager that hands the tensor at the cut to a function, which may replace it; it
  refuses a module that runs more than once per forward pass (h would be ambiguous) and a non-tensor value;
- :func:`capture`: z = h(x), stopping the forward pass as soon as z is known (nothing above the cut runs);
- :func:`replace`: g(z), by running the model on a dummy input and substituting z at the cut.

``replace`` is exact for any model whose computation after the cut depends on the input only through z (chains
such as MLPs and small CNNs); a skip connection around the cut would leak the dummy input into g.
Used by the influence explanations (:mod:`modelward.explain.influence`) and the white-box membership attacks
(:mod:`modelward.privacy.slicing`).

Example:
    >>> import torch
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    >>> z = capture(net, Cut("2", "in"), torch.ones(5, 3))       # penultimate features h(x)
    >>> y = replace(net, Cut("2", "in"), z, torch.zeros(5, 3))   # g(h(x))
    >>> torch.allclose(y, net(torch.ones(5, 3)))
    True
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from modelward.errors import ConfigError

Anchor = Literal["in", "out"]

__all__ = ["Anchor", "Cut", "Interception", "StopForward", "capture", "intercept", "module_names", "replace",
           "resolve_module"]


@dataclass(frozen=True)
class Cut:
    """Where f = g ∘ h is cut: the module ``layer`` and whether z is its input (``"in"``) or output (``"out"``).

    Args:
        layer: the module's name in ``model.named_modules()``.
        anchor: ``"out"`` (z = the module's output) or ``"in"`` (z = its first positional input).
        field: the config field named in error messages.

    Example:
        >>> Cut("fc1")
        Cut(layer='fc1', anchor='out', field='slice')
    """

    layer: str
    anchor: Anchor = "out"
    field: str = "slice"


def module_names(model: nn.Module) -> list[str]:
    """Every addressable module name of `model` (what a user can type as a cut)."""
    return [n for n, _ in model.named_modules() if n]


def resolve_module(model: nn.Module, name: str, field: str = "slice") -> nn.Module:
    """The module called `name` in `model`, or a ConfigError that names `field` and lists the valid names."""
    mods = dict(model.named_modules())
    if name and name in mods:
        return mods[name]
    names = module_names(model)
    shown = ", ".join(names[:40]) + (" ..." if len(names) > 40 else "")
    raise ConfigError(f"{field}: unknown layer {name!r}; valid layers: {shown}")


class StopForward(Exception):
    """Raised by an interception function to stop the forward pass once it has what it needs."""


@dataclass
class Interception:
    """What :func:`intercept` saw: ``calls`` (times the cut ran in the block) and the last ``value`` there."""

    calls: int = 0
    value: torch.Tensor | None = None

    def check_called(self, cut: Cut) -> torch.Tensor:
        """The intercepted tensor; a ConfigError when the forward pass never reached the cut."""
        if self.value is None:
            raise ConfigError(f"{cut.field} {cut.layer!r}: the module was not called by the model's forward pass")
        return self.value


@contextmanager
def intercept(model: nn.Module, cut: Cut, fn: Callable[[torch.Tensor], torch.Tensor | None] | None = None,
              module: nn.Module | None = None) -> Iterator[Interception]:
    """Hand the tensor at `cut` to `fn` on every forward pass inside the block; `fn` may return a replacement.

    Args:
        model: the network.
        cut: where (its module must run once per forward pass).
        fn: called with the tensor at the cut; returns a tensor to use instead, or None to keep it. It may raise
            to stop the pass (see :func:`capture`).
        module: the module itself, when the caller already resolved ``cut.layer``.

    Returns:
        A context manager yielding an :class:`Interception` (``calls`` / ``value``); use one block per forward
        pass, since the called-once check counts every call inside the block.

    Raises:
        ConfigError: the module runs a second time in the block, or the value at the cut is not a tensor.
    """
    mod = module if module is not None else resolve_module(model, cut.layer, cut.field)
    seen = Interception()

    def visit(value: Any) -> torch.Tensor | None:
        if seen.calls:
            raise ConfigError(f"{cut.field} {cut.layer!r}: the module runs more than once per forward pass; "
                              "cut at a module that is called once")
        seen.calls += 1
        where = "output" if cut.anchor == "out" else "input"
        if not torch.is_tensor(value):
            raise ConfigError(f"{cut.field} {cut.layer!r}: its {where} is a {type(value).__name__}, not a tensor")
        seen.value = value
        new = fn(value) if fn is not None else None
        if new is not None:
            seen.value = new
        return new

    if cut.anchor == "out":
        handle = mod.register_forward_hook(lambda _m, _a, out: visit(out))
    elif cut.anchor == "in":
        def pre(_m: nn.Module, args: tuple) -> tuple | None:
            new = visit(args[0] if args else None)
            return None if new is None else (new, *args[1:])

        handle = mod.register_forward_pre_hook(pre)
    else:
        raise ConfigError(f"{cut.field}: anchor {cut.anchor!r}; valid choices: 'in', 'out'")
    try:
        yield seen
    finally:
        handle.remove()


def capture(model: nn.Module, cut: Cut, x: torch.Tensor, module: nn.Module | None = None) -> torch.Tensor:
    """z = h(x): the tensor at `cut` for inputs `x`; the forward pass stops there (Def. 3.1).

    Runs in the model's current mode and grad mode (wrap in :func:`~modelward.core.modules.eval_mode` and
    ``torch.no_grad()`` as needed).

    Args:
        model: the network; x: a batch of inputs on the model's device; module: `cut`'s module if resolved.

    Returns:
        The tensor at the cut (not detached, not copied).

    Raises:
        ConfigError: the cut is unknown, never reached, or not a tensor.
    """
    def stop(_z: torch.Tensor) -> None:
        raise StopForward

    with intercept(model, cut, stop, module) as seen:
        try:
            model(x)
        except StopForward:
            pass
    return seen.check_called(cut)


def replace(model: nn.Module, cut: Cut, z: torch.Tensor, x: torch.Tensor,
            module: nn.Module | None = None) -> torch.Tensor:
    """g(z): the model's output when the tensor at `cut` is replaced by `z`, driven by the (dummy) input `x`.

    Args:
        model: the network; cut: where; z: the replacement (the cut's per-example shape, batch first);
        x: inputs that drive the forward pass (e.g. zeros of the input shape; they matter only below the cut);
        module: `cut`'s module if resolved.

    Returns:
        The model's output.
    """
    with intercept(model, cut, lambda _v: z, module) as seen:
        y = model(x)
    seen.check_called(cut)
    return y
