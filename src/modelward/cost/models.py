"""Models every cost backend can run: polynomial (x²) activations only, as CryptoNets-style HE and MPC need.

HE (CKKS) can only evaluate polynomials, and MPC pays a full comparison protocol for every ReLU, so the
comparison (issue 16, seed 000 §1) uses the square activation ``x ↦ x²`` throughout. The models are
``nn.Sequential`` subclasses with a ``split_layers()`` method, so the governance split path (``plan.model_layers``)
cuts them at layer boundaries and the party processes rebuild them from a ``[model]`` entry-point config:

    [model]
    arch = "entrypoint"
    entrypoint = "modelward.cost.models:square_mlp"
    kwargs = { hidden = [32, 16] }
"""

from __future__ import annotations

import torch
from torch import nn

from modelward.core.entrypoints import shipped_factory


class Square(nn.Module):
    """The polynomial activation ``x²`` (CryptoNets' choice): one multiplication, depth 1 under HE."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * x


class SquareNet(nn.Sequential):
    """A chain of named modules; ``split_layers`` groups each linear/conv module with its activation.

    Args:
        layers: ``[(layer_name, [(child_name, module), ...]), ...]`` in forward order.
    """

    def __init__(self, layers: list[tuple[str, list[tuple[str, nn.Module]]]]) -> None:
        super().__init__()
        self._split: list[tuple[str, list[tuple[str, str]]]] = []
        self.part_names: list[str] = []
        for lname, children in layers:
            ops = []
            for cname, mod in children:
                self.add_module(cname, mod)
                ops.append(("module", cname))
            self._split.append((lname, ops))
            self.part_names.append(lname)

    def split_layers(self) -> list[tuple[str, list[tuple[str, str]]]]:
        """The cut-able layers for :func:`modelward.governance.plan.model_layers`."""
        return [(n, list(ops)) for n, ops in self._split]


@shipped_factory
def square_mlp(input_shape: tuple[int, ...], num_classes: int, hidden: list[int] | None = None) -> SquareNet:
    """MLP ``flatten → (Linear → x²)* → Linear`` (the HE/MPC-friendly counterpart of the zoo MLP).

    Args:
        input_shape: one sample's shape, e.g. (1, 8, 8) for digits or (30,) for breast_cancer.
        num_classes: logits.
        hidden: hidden widths (default [32]).
    Returns:
        a :class:`SquareNet` with layers ``fc1 … fcK, logits``.
    Example:
        >>> square_mlp((30,), 2, [8])(torch.zeros(4, 30)).shape
        torch.Size([4, 2])
    """
    hidden = [32] if hidden is None else list(hidden)
    n_in = 1
    for d in input_shape:
        n_in *= int(d)
    layers: list[tuple[str, list[tuple[str, nn.Module]]]] = []
    dims = [n_in, *hidden]
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:], strict=True), start=1):
        pre: list[tuple[str, nn.Module]] = [("flatten", nn.Flatten())] if i == 1 else []
        layers.append((f"fc{i}", [*pre, (f"fc{i}", nn.Linear(a, b)), (f"act{i}", Square())]))
    pre = [("flatten", nn.Flatten())] if not hidden else []
    layers.append(("logits", [*pre, ("logits", nn.Linear(dims[-1], num_classes))]))
    return SquareNet(layers)


@shipped_factory
def square_cnn(input_shape: tuple[int, ...], num_classes: int, channels: int = 4, kernel: int = 3,
               stride: int = 2, fc: int = 32) -> SquareNet:
    """Small CryptoNets-style CNN: ``Conv(stride) → x² → flatten → Linear → x² → Linear``.

    Strided convolution instead of pooling: max-pooling is not a polynomial, and CryptoNets' scaled mean-pool is
    linear anyway (the HE/MPC backends lower convolutions to their exact dense matrices).

    Args:
        input_shape: (C, H, W).
        num_classes: logits.
        channels: conv output channels.
        kernel, stride: conv geometry (padding kernel // 2).
        fc: hidden units after the convolution.
    Returns:
        a :class:`SquareNet` with layers ``conv1, fc1, logits``.
    Example:
        >>> square_cnn((1, 8, 8), 10)(torch.zeros(2, 1, 8, 8)).shape
        torch.Size([2, 10])
    """
    if len(input_shape) != 3:
        raise ValueError(f"square_cnn needs image inputs (C, H, W), got input shape {tuple(input_shape)}")
    c, h, w = (int(d) for d in input_shape)
    conv = nn.Conv2d(c, channels, kernel, stride, kernel // 2)
    with torch.no_grad():
        n_flat = conv(torch.zeros(1, c, h, w)).numel()
    return SquareNet([
        ("conv1", [("conv1", conv), ("act1", Square())]),
        ("fc1", [("flatten", nn.Flatten()), ("fc1", nn.Linear(n_flat, fc)), ("act2", Square())]),
        ("logits", [("logits", nn.Linear(fc, num_classes))]),
    ])
