"""Split plans: cut a model into contiguous segments owned by named parties (seed 000 §1, Alice/Bob protocol).

A model is first decomposed into an ordered list of *layers*; each layer is a short program of ops (call a
top-level submodule, flatten, ReLU) so that running the layers in order reproduces ``model(x)`` exactly. A party
owns a contiguous run of layers; the first party holds the inputs, the last one the labels and the loss.

Decompositions are known for the zoo models (MLP, SmallCNN, AlexNetStyle, ResNetStyle) and plain
``nn.Sequential``; any other model can expose ``split_layers() -> list[tuple[str, list[Op]]]`` itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from modelward.core import zoo
from modelward.errors import ModelwardError

Op = tuple[str, ...]  # ("module", name) | ("flatten",) | ("relu",)


class PlanError(ModelwardError):
    """A split plan does not fit the model (unknown layer, non-contiguous segment, unsupported architecture)."""


@dataclass(frozen=True)
class Layer:
    """One cut-able unit: a name (a part name where possible) and the ops that compute it."""

    name: str
    ops: tuple[Op, ...]

    @property
    def modules(self) -> list[str]:
        return [op[1] for op in self.ops if op[0] == "module"]


def model_layers(model: nn.Module) -> list[Layer]:
    """The ordered layer decomposition of `model` (see the module docstring for what is supported)."""
    if hasattr(model, "split_layers"):
        return [Layer(n, tuple(tuple(o) for o in ops)) for n, ops in model.split_layers()]
    if isinstance(model, zoo.MLP):
        layers = []
        for i in range(1, model.n_hidden + 1):
            pre: tuple[Op, ...] = (("flatten",),) if i == 1 else ()
            layers.append(Layer(f"fc{i}", (*pre, ("module", f"fc{i}"), ("relu",))))
        pre = (("flatten",),) if model.n_hidden == 0 else ()
        layers.append(Layer("logits", (*pre, ("module", "logits"))))
        return layers
    if isinstance(model, zoo.SmallCNN):
        layers = [Layer(f"conv{i}", (("module", f"conv{i}"),)) for i in range(1, model.n_conv + 1)]
        layers.append(Layer("fc1", (("flatten",), ("module", "fc1"), ("relu",))))
        layers.append(Layer("logits", (("module", "logits"),)))
        return layers
    if isinstance(model, zoo.AlexNetStyle):
        return [
            Layer("conv1", (("module", "conv1"), ("module", "pool1"))),
            Layer("conv2", (("module", "conv2"), ("module", "pool2"))),
            Layer("conv3", (("module", "conv3"),)),
            Layer("conv4", (("module", "conv4"),)),
            Layer("conv5", (("module", "conv5"), ("module", "pool5"))),
            Layer("linear1", (("module", "gap"), ("flatten",), ("module", "linear1"), ("relu",))),
            Layer("linear2", (("module", "linear2"), ("relu",))),
            Layer("logits", (("module", "logits"),)),
        ]
    if isinstance(model, zoo.ResNetStyle):
        layers = [Layer("conv1", (("module", "conv1"), ("module", "pool")))]
        layers += [Layer(f"layer{i}", (("module", f"layer{i}"),)) for i in range(1, model.n_sections + 1)]
        layers.append(Layer("fc", (("module", "gap"), ("flatten",), ("module", "fc"))))
        return layers
    if isinstance(model, nn.Sequential):
        return [Layer(n, (("module", n),)) for n, _ in model.named_children()]
    raise PlanError(f"cannot split a {type(model).__name__}: supported are the zoo models (mlp, cnn, alexnet, "
                    "resnet), nn.Sequential, or a model with a split_layers() method returning "
                    "[(name, [('module', child) | ('flatten',) | ('relu',)]), ...]")


def run_ops(owner: nn.Module, ops: tuple[Op, ...], x: torch.Tensor) -> torch.Tensor:
    for op in ops:
        if op[0] == "module":
            x = getattr(owner, op[1])(x)
        elif op[0] == "flatten":
            x = x.flatten(1)
        elif op[0] == "relu":
            x = torch.relu(x)
        else:
            raise PlanError(f"unknown op {op!r}; valid: module, flatten, relu")
    return x


class Segment(nn.Module):
    """The layers a party owns. Holds only those submodules, under the model's names, so its parameter and buffer
    names are the full model's names (``conv1.0.conv.weight``)."""

    def __init__(self, model: nn.Module, layers: list[Layer]) -> None:
        super().__init__()
        self.layer_names = [lay.name for lay in layers]
        self._ops = [op for lay in layers for op in lay.ops]
        for lay in layers:
            for m in lay.modules:
                if not hasattr(self, m):
                    self.add_module(m, getattr(model, m))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return run_ops(self, tuple(self._ops), x)


@dataclass(frozen=True)
class SplitPlan:
    """Which party owns which layers, in chain order (first = data owner, last = label owner).

    Args:
        layers: the model's layer names in chain order.
        owners: party name -> its layer names (insertion order = chain order).

    Returns:
        The plan (usually built by :func:`make_plan`); ``parties`` lists the party names in chain order.

    Example:
        >>> SplitPlan(["fc1", "fc2"], {"alice": ["fc1"], "bob": ["fc2"]}).parties
        ['alice', 'bob']
    """

    layers: list[str]
    owners: dict[str, list[str]] = field(default_factory=dict)  # party -> its layer names, insertion = chain order

    @property
    def parties(self) -> list[str]:
        return list(self.owners)


def check_segment(all_layers: list[str], mine: list[str], who: str = "party") -> tuple[int, int]:
    """Validate that `mine` is a non-empty contiguous run of `all_layers`; return its [start, end) range."""
    if not mine:
        raise PlanError(f"{who}: 'layers' is empty; valid layer names: {all_layers}")
    unknown = [m for m in mine if m not in all_layers]
    if unknown:
        raise PlanError(f"{who}: unknown layer(s) {unknown}; valid layer names in order: {all_layers}")
    start = all_layers.index(mine[0])
    if all_layers[start : start + len(mine)] != mine:
        raise PlanError(f"{who}: layers {mine} are not contiguous and in forward order; the model's layers are "
                        f"{all_layers}")
    return start, start + len(mine)


def make_plan(model: nn.Module, parties: list[str], cuts: list[str]) -> SplitPlan:
    """Cut after each layer in `cuts` (len(parties) - 1 cuts, in order): party i gets the layers up to cut i.

    Args:
        model: the whole model (its layers in chain order, see :func:`model_layers`).
        parties: party names, data owner first, label owner last.
        cuts: the last layer of every party but the last (``len(parties) - 1`` names, in chain order).

    Returns:
        :class:`SplitPlan` (``owners``: party -> its layer names); PlanError names the valid layers otherwise.

    Example:
        >>> from torch import nn
        >>> model = nn.Sequential()
        >>> model.add_module("fc1", nn.Linear(4, 8)); model.add_module("act", nn.ReLU())
        >>> model.add_module("logits", nn.Linear(8, 3))
        >>> make_plan(model, ["alice", "bob"], ["fc1"]).parties
        ['alice', 'bob']
    """
    names = [lay.name for lay in model_layers(model)]
    if len(parties) < 2:
        raise PlanError(f"a split needs at least 2 parties, got {parties}")
    if len(set(parties)) != len(parties):
        raise PlanError(f"party names must be distinct, got {parties}")
    if len(cuts) != len(parties) - 1:
        raise PlanError(f"{len(parties)} parties need {len(parties) - 1} cut point(s), got {cuts}")
    owners: dict[str, list[str]] = {}
    start = 0
    for party, cut in zip(parties, [*cuts, None], strict=True):
        if cut is None:
            end = len(names)
        else:
            if cut not in names:
                raise PlanError(f"cut {cut!r} is not a layer; valid cut points: {names[:-1]}")
            end = names.index(cut) + 1
        if end <= start or (cut is not None and end >= len(names)):
            raise PlanError(f"cut points {cuts} must be increasing and leave every party at least one layer "
                            f"(layers: {names})")
        owners[party] = names[start:end]
        start = end
    return SplitPlan(names, owners)


def segment_of(model: nn.Module, layer_names: list[str], who: str = "party") -> Segment:
    layers = model_layers(model)
    check_segment([lay.name for lay in layers], layer_names, who)
    return Segment(model, [lay for lay in layers if lay.name in layer_names])


def segment_param_names(model: nn.Module, layer_names: list[str]) -> list[str]:
    return [n for n, _ in segment_of(model, layer_names).named_parameters()]


def infer_model_config(model: nn.Module):  # -> ModelConfig
    """Recover the zoo ModelConfig of an MLP or SmallCNN instance (so a party process can rebuild it)."""
    if isinstance(model, zoo.MLP):
        return zoo.ModelConfig(arch="mlp", hidden=[getattr(model, f"fc{i}").out_features
                                                   for i in range(1, model.n_hidden + 1)])
    if isinstance(model, zoo.SmallCNN):
        convs = [getattr(model, f"conv{i}")[0] for i in range(1, model.n_conv + 1)]
        return zoo.ModelConfig(arch="cnn", channels=[c.conv.out_channels for c in convs], fc=model.fc1.out_features,
                               batch_norm=isinstance(convs[0].bn, nn.BatchNorm2d))
    raise PlanError(f"cannot describe a {type(model).__name__} as a zoo config for the party processes; "
                    "supported: MLP, SmallCNN")
