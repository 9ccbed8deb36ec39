"""The slice f = g ∘ h of an explanation (seed 002 Def. 3.1): where the network is cut, and where the quantity of
interest reads (the cutting itself is :mod:`modelward.core.slicing`)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from modelward.core.slicing import Cut, resolve_module
from modelward.errors import ConfigError

__all__ = ["Slice", "resolve_module"]


@dataclass(frozen=True)
class Slice:
    """A decomposition f = g ∘ h (Def. 3.1): ``from_layer`` is the module whose *output* is z = h(x)
    (``None`` = the input itself, h = identity; ``"fc:in"`` = the *input* of module ``fc``, e.g. the features a
    classifier reads when no module outputs them as they are, see :mod:`modelward.explain.layers`); ``to_layer`` is
    the module whose output the quantity of interest reads (``None`` = the model output). ``Slice(None, "conv2")``
    with a unit QoI localises an internal unit (§3.3).

    Args:
        from_layer: the module whose output is z = h(x) (None: the input).
        to_layer: the module whose output the QoI reads (None: the model output).

    Returns:
        The slice; ``check(model)`` raises ``ConfigError`` naming the valid module names when a layer is unknown.

    Example:
        >>> Slice("fc1")            # influence of the fc1 units on the output
        Slice(from_layer='fc1', to_layer=None)
        >>> Slice(None, "conv2")    # input influence on conv2's units
        Slice(from_layer=None, to_layer='conv2')
    """

    from_layer: str | None = None
    to_layer: str | None = None

    @property
    def cut(self) -> Cut:
        """The cut of ``from_layer`` (its output, or its input for a ``":in"`` name)."""
        assert self.from_layer is not None
        name, _, anchor = self.from_layer.partition(":")
        return Cut(name, "in" if anchor == "in" else "out", "slice.from_layer")

    def check(self, model: nn.Module) -> None:
        for field, layer in (("slice.from_layer", self.from_layer), ("slice.to_layer", self.to_layer)):
            if layer is not None:
                name, _, anchor = layer.partition(":")
                if anchor not in ("", "in"):
                    raise ConfigError(f"{field} {layer!r}: the only suffix is ':in' (the module's input)")
                resolve_module(model, name, field)
        if self.from_layer is not None and self.from_layer == self.to_layer:
            raise ConfigError("slice: from_layer and to_layer are the same module; the QoI must be above the slice")
