"""Lower a model to the straight-line program the HE and MPC backends evaluate: affine maps and squares.

HE (CKKS) and secret-shared MPC evaluate additions and multiplications only. Every linear module (Linear,
Conv1d/2d, AvgPool, BatchNorm in eval mode, Flatten, Identity, Dropout in eval mode) is an affine map of its
input, so each maximal run of them is replaced by its exact dense matrix ``W`` and offset ``b``
(``y = W x + b``, computed by probing the run with the unit basis in float64). The only non-linearity allowed is
``x²`` (:class:`modelward.cost.models.Square`, ``x * x``, ``x ** 2``, ``torch.square``). Anything else (ReLU,
max-pooling, softmax, residual additions) is refused with the name of the layer, so the user knows what to
replace.

Example:
    >>> from modelward.cost.models import square_mlp
    >>> prog = lower(square_mlp((30,), 2, [8]).eval(), (30,), backend="he")
    >>> [op.kind for op in prog.ops]
    ['affine', 'square', 'affine']
"""

from __future__ import annotations

import copy
import operator
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.fx
from torch import nn

from modelward.cost.models import Square
from modelward.errors import ModelwardError

LINEAR_MODULES: tuple[type[nn.Module], ...] = (
    nn.Linear, nn.Conv1d, nn.Conv2d, nn.AvgPool1d, nn.AvgPool2d, nn.BatchNorm1d, nn.BatchNorm2d, nn.Flatten,
    nn.Identity, nn.Dropout,
)
LINEAR_METHODS = {"flatten", "view", "reshape", "contiguous"}
SUPPORTED = ("Linear, Conv1d/Conv2d, AvgPool1d/2d, BatchNorm (eval), Flatten, Identity, Dropout (eval) and the "
             "x² activation (modelward.cost.models.Square, x * x, x ** 2, torch.square)")


class UnsupportedLayer(ModelwardError):
    """A backend cannot evaluate one of the model's layers; the message names the layer and what is supported."""


@dataclass(frozen=True)
class Op:
    """One step of the program: ``affine`` (``y = W x + b``) or ``square`` (``y = x ⊙ x``)."""

    kind: str  # "affine" | "square"
    name: str  # the model's layer names it came from, e.g. "fc1" or "conv1+flatten+fc1"
    weight: np.ndarray | None = None  # (out, in) float64
    bias: np.ndarray | None = None  # (out,) float64
    dense: bool = False  # exactly one nn.Linear (plus reshapes): its W, b are the module's own parameters

    @property
    def shape(self) -> tuple[int, int]:
        assert self.weight is not None
        return int(self.weight.shape[0]), int(self.weight.shape[1])


@dataclass
class Program:
    """The lowered model: input features, output features and the ops in order."""

    in_features: int
    out_features: int
    ops: list[Op] = field(default_factory=list)

    @property
    def depth(self) -> int:
        """Multiplicative depth: one level per affine (plaintext × ciphertext) and per square."""
        return len(self.ops)

    def multiplications(self) -> int:
        """Scalar multiplications of one sample (``in·out`` per affine, ``n`` per square)."""
        total, width = 0, self.in_features
        for op in self.ops:
            if op.kind == "affine":
                total += op.shape[0] * op.shape[1]
                width = op.shape[0]
            else:
                total += width
        return total

    def sgd_mse_step(self, x: np.ndarray, t: np.ndarray, lr: float) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Reference SGD step on L = 1/(2B)·Σ‖y − t‖² in float64: the updated (W, b) of every affine op.

        Example:
            >>> p = Program(2, 1, [Op("affine", "fc", np.ones((1, 2)), np.zeros(1), True)])
            >>> p.sgd_mse_step(np.ones((1, 2)), np.zeros((1, 1)), 0.5)[0][0]
            array([[0., 0.]])
        """
        acts = [np.asarray(x, dtype=np.float64).reshape(len(x), -1)]
        for op in self.ops:
            h = acts[-1]
            acts.append(h @ op.weight.T + op.bias if op.kind == "affine" else h * h)
        g = (acts[-1] - t) / len(x)
        new: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for i in range(len(self.ops) - 1, -1, -1):
            op, a_in = self.ops[i], acts[i]
            if op.kind == "affine":
                new[i] = (op.weight - lr * (g.T @ a_in), op.bias - lr * g.sum(0))
                g = g @ op.weight
            else:
                g = 2 * a_in * g
        return new

    def run(self, x: np.ndarray) -> np.ndarray:
        """Reference evaluation in float64 on a batch (n, in_features): what every backend must reproduce."""
        h = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
        for op in self.ops:
            h = h @ op.weight.T + op.bias if op.kind == "affine" else h * h
        return h


class _Tracer(torch.fx.Tracer):
    """Keeps :class:`Square` as one node, so errors and op names use the model's own layer names."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, Square) or super().is_leaf_module(m, module_qualified_name)


def _is_square(node: torch.fx.Node, gm: torch.fx.GraphModule) -> bool:
    if node.op == "call_module":
        return isinstance(gm.get_submodule(str(node.target)), Square)
    if node.op == "call_function":
        if node.target in (torch.square,):
            return True
        if node.target is operator.mul and len(node.args) == 2 and node.args[0] is node.args[1]:
            return True
        if node.target in (operator.pow, torch.pow) and len(node.args) == 2 and node.args[1] == 2:
            return True
    if node.op == "call_method":
        if node.target == "square":
            return True
        if node.target == "pow" and len(node.args) == 2 and node.args[1] == 2:
            return True
        if node.target == "mul" and len(node.args) == 2 and node.args[0] is node.args[1]:
            return True
    return False


def _is_linear(node: torch.fx.Node, gm: torch.fx.GraphModule) -> bool:
    if node.op == "call_module":
        mod = gm.get_submodule(str(node.target))
        if isinstance(mod, Square):
            return False
        return isinstance(mod, LINEAR_MODULES)
    if node.op == "call_method":
        return node.target in LINEAR_METHODS
    if node.op == "call_function":
        return node.target in (torch.flatten, torch.reshape)
    return False


def _label(node: torch.fx.Node, gm: torch.fx.GraphModule) -> str:
    if node.op == "call_module":
        return f"'{node.target}' ({type(gm.get_submodule(str(node.target))).__name__})"
    tgt = getattr(node.target, "__name__", str(node.target))
    before = node.all_input_nodes[0] if node.all_input_nodes else None
    after = f" after '{before.target}'" if before is not None and before.op == "call_module" else ""
    return f"'{node.name}' (torch {tgt}{after})"


def _affine_of(fn: nn.Module, in_shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """The exact dense (W, b) of an affine function, probed in float64 with the unit basis."""
    n_in = int(np.prod(in_shape))
    with torch.no_grad():
        zero = fn(torch.zeros(1, *in_shape, dtype=torch.float64))
        out_shape = tuple(zero.shape[1:])
        basis = torch.eye(n_in, dtype=torch.float64).reshape(n_in, *in_shape)
        cols = fn(basis).reshape(n_in, -1) - zero.reshape(1, -1)
    return cols.T.numpy().copy(), zero.reshape(-1).numpy().copy(), out_shape


class _Run(nn.Module):
    """A run of consecutive linear nodes, replayed in order."""

    def __init__(self, gm: torch.fx.GraphModule, nodes: list[torch.fx.Node]) -> None:
        super().__init__()
        self.gm, self.nodes = gm, nodes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for node in self.nodes:
            if node.op == "call_module":
                x = self.gm.get_submodule(str(node.target))(x)
            elif node.op == "call_method":
                rest = [a for a in node.args[1:]]
                x = getattr(x, str(node.target))(*rest, **node.kwargs)
            else:
                rest = [a for a in node.args[1:]]
                x = node.target(x, *rest, **node.kwargs)  # type: ignore[operator]
        return x


def lower(model: nn.Module, input_shape: tuple[int, ...], backend: str = "he") -> Program:
    """Trace `model` with torch.fx and lower it to affine/square ops (module docstring).

    Args:
        model: the trained model (its eval-mode behaviour is lowered; it is not modified).
        input_shape: one sample's shape, without the batch dimension.
        backend: named in the error when a layer cannot be lowered.
    Returns:
        the :class:`Program`.
    Raises:
        UnsupportedLayer: naming the first layer that is not affine or x², or a non-chain graph (residual).
    """
    net = copy.deepcopy(model).double().eval()
    try:
        gm = torch.fx.GraphModule(net, _Tracer().trace(net))
    except Exception as e:  # noqa: BLE001 - any tracing failure means the backend cannot run this model
        raise UnsupportedLayer(f"backend {backend}: cannot trace {type(model).__name__} into a straight-line "
                               f"program ({type(e).__name__}: {e}); supported layers: {SUPPORTED}") from None
    prev: torch.fx.Node | None = None
    run: list[torch.fx.Node] = []
    ops: list[Op] = []
    shape = tuple(int(d) for d in input_shape)
    n_in = int(np.prod(shape))

    def flush() -> None:
        nonlocal shape, run
        if not run:
            return
        names = "+".join(str(n.target) if n.op == "call_module" else n.name for n in run)
        w, b, out_shape = _affine_of(_Run(gm, run), shape)
        mods = [gm.get_submodule(str(n.target)) for n in run if n.op == "call_module"]
        dense = (sum(isinstance(m, nn.Linear) for m in mods) == 1
                 and all(isinstance(m, nn.Linear | nn.Flatten | nn.Identity | nn.Dropout) for m in mods))
        if ops and ops[-1].kind == "affine":  # two affine runs in a row (e.g. split by a no-op): compose them
            last = ops.pop()
            w, b, names, dense = w @ last.weight, w @ last.bias + b, f"{last.name}+{names}", False
        ops.append(Op("affine", names, w, b, dense))
        shape, run = out_shape, []

    for node in gm.graph.nodes:
        if node.op == "placeholder":
            prev = node
            continue
        if node.op == "output":
            if node.args[0] is not prev:
                raise UnsupportedLayer(f"backend {backend}: the model's output is not the last layer's output; "
                                       "only straight-line models are supported")
            break
        if node.op == "get_attr":
            raise UnsupportedLayer(f"backend {backend} cannot run layer {_label(node, gm)}: parameters used "
                                   f"outside a module; supported layers: {SUPPORTED}")
        inputs = [a for a in node.all_input_nodes]
        if inputs != [prev]:
            raise UnsupportedLayer(f"backend {backend} cannot run layer {_label(node, gm)}: it combines several "
                                   "tensors (e.g. a residual connection); only straight-line models are "
                                   f"supported ({SUPPORTED})")
        if _is_square(node, gm):
            flush()
            ops.append(Op("square", str(node.target) if node.op == "call_module" else node.name))
        elif _is_linear(node, gm):
            if node.op == "call_module":
                mod = gm.get_submodule(str(node.target))
                if isinstance(mod, nn.BatchNorm1d | nn.BatchNorm2d) and not mod.track_running_stats:
                    raise UnsupportedLayer(f"backend {backend} cannot run layer {_label(node, gm)}: batch norm "
                                           "without running statistics is not affine at inference")
            run.append(node)
        else:
            raise UnsupportedLayer(f"backend {backend} cannot run layer {_label(node, gm)}: only affine layers and "
                                   f"the x² activation can be evaluated under encryption / secret sharing. "
                                   f"Supported: {SUPPORTED}")
        prev = node
    flush()
    if not ops or ops[0].kind != "affine":
        ops.insert(0, Op("affine", "identity", np.eye(n_in), np.zeros(n_in)))
    out = ops[-1].shape[0] if ops[-1].kind == "affine" else int(np.prod(shape))
    return Program(n_in, out, ops)
