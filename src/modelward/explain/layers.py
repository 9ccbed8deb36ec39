"""Which layer holds the features the classifier reads: the default slice of unit explanations (issue 38 item 5).

"The penultimate layer" is not the module registered before the last ``nn.Linear``: in a residual network that is
the BatchNorm of the last block's shortcut branch, one of two summands of what the classifier reads. The choice
here follows the data flow of one forward pass instead:

1. the *classifier* is the ``nn.Linear`` whose output is the model's output (else the last ``nn.Linear`` run);
2. from the classifier's input, the autograd graph is walked back through operations that keep the features as
   they are — reshapes (``flatten``, ``view``), element-wise activations and dropout, and modules without
   parameters that keep the shape (``nn.ReLU``, a GloRo MinMax, ``nn.Identity``, ``nn.Flatten``);
3. the first module whose output is reached is the layer: ``gap`` (the pooled features) of the zoo's ResNet,
   ``avgpool`` of a torchvision ResNet, ``fc1`` of the zoo's CNN and MLP (their ReLU is functional), the last
   hidden ``nn.Linear`` of an ``nn.Sequential`` MLP. Of several modules with that same output (a stage and its
   last block) the outermost is named;
4. where the walk meets an operation no module owns (a functional pooling ``x.mean((2, 3))``, branches summed or
   concatenated in ``forward``), the features exist only as the classifier's input: the layer is then
   ``"<classifier>:in"``, a slice at the classifier's input (:class:`~modelward.explain.slices.Slice` reads the
   suffix).

Example:
    >>> import torch
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    >>> feature_layer(net, torch.randn(2, 4))
    '0'
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from modelward.core.modules import eval_mode
from modelward.errors import ConfigError

#: autograd nodes that keep the features as they are (reshapes, element-wise activations, copies, dropout)
_TRANSPARENT = {"View", "UnsafeView", "ReshapeAlias", "Clone", "Squeeze", "Unsqueeze", "Alias", "ToCopy",
                "Relu", "LeakyRelu", "Gelu", "Sigmoid", "Tanh", "Elu", "Silu", "Hardtanh", "Hardswish", "Mish",
                "Softplus", "NativeDropout", "Threshold", "Clamp", "ClampMin"}


def _transparent_node(node: Any) -> bool:
    return type(node).__name__.rstrip("0123456789").removesuffix("Backward") in _TRANSPARENT


def _transparent_module(m: nn.Module, inp: Any, out: Any) -> bool:
    """A module without parameters that keeps its input's shape (an activation, dropout, identity) or flattens."""
    if isinstance(m, nn.Flatten | nn.Unflatten):
        return True
    if any(True for _ in m.parameters()):
        return False
    return bool(inp) and torch.is_tensor(inp[0]) and torch.is_tensor(out) and inp[0].shape == out.shape


def feature_layer(model: nn.Module, x: torch.Tensor) -> str:
    """The layer whose output the classifier reads (see the module docstring), found on a forward pass of `x`.

    Args:
        model: the classifier (logits out).
        x: a few inputs (one is enough) on the model's device.

    Returns:
        A module name for :class:`~modelward.explain.slices.Slice` (``"gap"``), or ``"<classifier>:in"``.

    Raises:
        ConfigError: the model runs no ``nn.Linear`` (no classifier to read from).
    """
    # grad_fn of a module's output -> [(module, transparent, its input's grad_fn)], innermost module first
    outputs: dict[Any, list[tuple[str, bool, Any]]] = {}
    linear_in: dict[str, torch.Tensor] = {}
    linear_out: list[tuple[str, torch.Tensor]] = []
    handles = []

    def post(name: str) -> Any:
        def hook(m: nn.Module, inp: Any, out: Any) -> None:
            if torch.is_tensor(out) and out.grad_fn is not None:
                transparent = _transparent_module(m, inp, out)
                via = inp[0].grad_fn if transparent else None
                outputs.setdefault(out.grad_fn, []).append((name, transparent, via))
            if isinstance(m, nn.Linear) and torch.is_tensor(out):
                linear_in[name] = inp[0]
                linear_out.append((name, out))
        return hook

    for name, m in model.named_modules():
        if name:
            handles.append(m.register_forward_hook(post(name)))
    try:
        with eval_mode(model), torch.enable_grad():
            xi = x.detach().clone()
            # token ids (int64) cannot require grad; the parameters still give every module's output a grad_fn
            y = model(xi.requires_grad_(True) if xi.is_floating_point() else xi)
    finally:
        for h in handles:
            h.remove()
    if not linear_out:
        raise ConfigError("explanations: the model runs no nn.Linear, so there is no classifier whose input "
                          "features could be chosen; give the layer explicitly (explain.layer)")
    final = [n for n, o in linear_out if o is y]
    classifier = final[-1] if final else linear_out[-1][0]
    node = linear_in[classifier].grad_fn
    for _ in range(10_000):  # a walk down one path of the graph; bounded for safety
        if node is None:
            break
        owners = outputs.get(node, [])
        named = [n for n, transparent, _ in owners if not transparent]
        if named:
            return min(named, key=lambda n: n.count("."))  # the outermost of the modules with this output
        via = owners[-1][2] if owners else None
        if owners and via is not node:  # an activation / flatten module: continue from its input
            node = via
            continue
        if not _transparent_node(node):
            break
        nxt = [f for f, _ in node.next_functions if f is not None]
        if len(nxt) != 1:
            break
        node = nxt[0]
    return f"{classifier}:in"
