"""Interpreting influential internal units (seed 002 §3.3): find them, localise them, compare models.

Workflow of §3.3: (1) rank the units of a slice by their internal influence on a class (:func:`top_units`),
(2) visualise each unit by input attribution — the slice (h, h') with q(z) = z_i, i.e. ``Slice(None, layer)`` with a
unit/channel QoI (:func:`unit_attribution`) — or by inversion, an input that maximises the unit
(:func:`unit_inversion`, reusing :func:`modelward.privacy.inversion.invert` when that module is installed);
(3) compare what different models (e.g. a standard and a GloRo net) use on the same inputs (:func:`compare_models`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from modelward.core.modules import eval_mode, model_device
from modelward.errors import ConfigError
from modelward.explain.influence import (
    ChannelQoI,
    ClassQoI,
    DistributionOfInterest,
    GaussianDoI,
    InternalInfluence,
    LinearDoI,
    PointDoI,
    QuantityOfInterest,
    Slice,
    UnitQoI,
    resolve_module,
)
from modelward.explain.methods import METHODS as REGISTRY

Method = Literal["saliency", "integrated_gradients", "smoothgrad", "gradient_x_input"]
METHODS: tuple[str, ...] = ("saliency", "integrated_gradients", "smoothgrad", "gradient_x_input")


@dataclass(frozen=True)
class UnitScore:
    """A unit of a slice (a channel of a conv layer, a neuron of a dense layer) and its score for a class."""

    unit: int
    score: float


def unit_scores(per_point: torch.Tensor) -> torch.Tensor:
    """Per-unit scores from influences/attributions of shape (B, C, H, W) or (B, D): the mean over points,
    summed over spatial positions for convolutional maps (a channel is the unit)."""
    s = per_point.mean(0)
    return s.reshape(s.shape[0], -1).sum(1) if s.dim() > 1 else s


def top_units(model: nn.Module, layer: str, x: torch.Tensor, target: int | QuantityOfInterest, k: int = 5,
              by: Literal["influence", "attribution"] = "influence",
              doi: DistributionOfInterest | None = None, batch_size: int | None = None) -> list[UnitScore]:
    """The ``k`` units of ``layer`` with the largest influence on ``target`` over the points ``x`` (§3.3 step 1).

    The DoI is the sample set ``x`` (e.g. the test points of the class), each point explained with ``doi``
    (default: the point itself); ``by="attribution"`` ranks by influence × activation instead.

    Args:
        model: the model; layer: the slice's layer; x: the points (the DoI sample set).
        target: a class index or a :class:`~modelward.explain.influence.QuantityOfInterest`.
        k: how many units (≥ 1); by: ``"influence"`` or ``"attribution"``.
        doi: how each point is explained (default: the point itself); batch_size: rows per pass.

    Returns:
        The top ``k`` :class:`UnitScore` (unit index, score), highest first.

    Example:
        >>> net = nn.Sequential()
        >>> net.add_module("fc1", nn.Linear(4, 8)); net.add_module("act", nn.ReLU())
        >>> net.add_module("logits", nn.Linear(8, 3))
        >>> x_test = torch.randn(20, 4)
        >>> len(top_units(net, "fc1", x_test, target=2, k=3))
        3
    """
    if k < 1:
        raise ConfigError(f"top_units: k must be >= 1, got {k}")
    ii = InternalInfluence(model, Slice(layer), target, doi or PointDoI(), batch_size)
    vals = ii.attribution(x) if by == "attribution" else ii.influence(x)
    scores = unit_scores(vals)
    k = min(k, len(scores))
    top = torch.topk(scores, k)
    return [UnitScore(int(i), float(v)) for v, i in zip(top.values, top.indices, strict=True)]


def _unit_qoi(model: nn.Module, layer: str, unit: int, x: torch.Tensor) -> QuantityOfInterest:
    """A channel QoI for conv maps, a unit QoI for flat layers (decided from the layer's output shape)."""
    z = InternalInfluence(model, Slice(layer)).activation(x[:1])
    n_units = z.shape[1] if z.dim() > 1 else 1
    if not 0 <= unit < n_units:
        raise ConfigError(f"unit {unit} out of range: layer {layer!r} has {n_units} units")
    return ChannelQoI(unit) if z.dim() > 2 else UnitQoI(unit)


def attribute(model: nn.Module, x: torch.Tensor, qoi: QuantityOfInterest | int | str, method: Method,
              slice: Slice | None = None, steps: int = 64, std: float = 0.15, samples: int = 32, seed: int = 0,
              baseline: torch.Tensor | float | None = None, batch_size: int | None = None) -> torch.Tensor:
    """Input attributions of ``qoi`` by a named special case (§3.4) over one core (:class:`InternalInfluence`).

    Args:
        model: the model; x: the explained inputs; qoi: a QoI, a class index or ``"max"``.
        method: ``"saliency"``, ``"gradient_x_input"``, ``"smoothgrad"`` or ``"integrated_gradients"`` (unknown
            names raise ``ConfigError`` naming the valid ones).
        slice: an optional :class:`~modelward.explain.influence.Slice` (``to_layer`` reads the QoI inside).
        steps / baseline: for integrated gradients; std / samples / seed: for SmoothGrad; batch_size: rows per pass.

    Returns:
        The attributions (influences for saliency and SmoothGrad), shaped like ``x``.

    Example:
        >>> net = nn.Sequential()
        >>> net.add_module("fc1", nn.Linear(4, 8)); net.add_module("act", nn.ReLU())
        >>> net.add_module("logits", nn.Linear(8, 3))
        >>> x = torch.randn(5, 4)
        >>> attribute(net, x, 2, "integrated_gradients", steps=16).shape == x.shape
        True
    """
    params: dict[str, object] = {"layer": None if slice is None else slice.from_layer, "batch_size": batch_size}
    if method == "smoothgrad":
        params |= {"std": std, "samples": samples, "seed": seed}
    elif method == "integrated_gradients":
        params |= {"steps": steps, "baseline": baseline}
    if slice is not None and slice.to_layer is not None:
        # a QoI read at an internal layer (feature localisation) needs the full slice object
        doi = {"saliency": PointDoI(), "gradient_x_input": PointDoI(), "smoothgrad": GaussianDoI(std, samples, seed),
               "integrated_gradients": LinearDoI(baseline, steps)}
        if method not in doi:
            REGISTRY.get(method)  # raises ConfigError naming the valid choices
        ii = InternalInfluence(model, slice, qoi, doi[method], batch_size)
        return ii.influence(x) if method in ("saliency", "smoothgrad") else ii.attribution(x)
    return REGISTRY.create(method, model, x, qoi, **params)


def unit_attribution(model: nn.Module, layer: str, unit: int, x: torch.Tensor, method: Method = "integrated_gradients",
                     steps: int = 64, batch_size: int | None = None) -> torch.Tensor:
    """Localise a unit (§3.3 step 2): input attribution of q(z) = z_unit (summed over space for a channel) through
    the slice (h, h'), i.e. ``Slice(None, layer)``.

    Args:
        model: the model; layer: the layer holding the unit; unit: its index (a channel for conv maps).
        x: the inputs; method: the attribution method; steps: path steps; batch_size: rows per pass.

    Returns:
        The input attributions of the unit, shaped like ``x``.

    Example:
        >>> net = nn.Sequential()
        >>> net.add_module("fc1", nn.Linear(4, 8)); net.add_module("act", nn.ReLU())
        >>> net.add_module("logits", nn.Linear(8, 3))
        >>> x = torch.randn(5, 4)
        >>> unit_attribution(net, "fc1", 3, x, steps=16).shape == x.shape
        True
    """
    qoi = _unit_qoi(model, layer, unit, x)
    return attribute(model, x, qoi, method, Slice(None, layer), steps=steps, batch_size=batch_size)


class _UnitOutput(nn.Module):
    """The model seen as a map input → the units of ``layer`` (flattened units, or channel sums of conv maps),
    so a class-targeted inversion maximises a unit."""

    def __init__(self, model: nn.Module, layer: str) -> None:
        super().__init__()
        self.model = model
        self.layer = layer
        self.module = resolve_module(model, layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: dict[str, torch.Tensor] = {}

        def grab(_m: nn.Module, _i: object, o: torch.Tensor) -> None:
            out["z"] = o

        h = self.module.register_forward_hook(grab)
        try:
            self.model(x)
        finally:
            h.remove()
        z = out["z"]
        return z.reshape(z.shape[0], z.shape[1], -1).sum(2) if z.dim() > 2 else z.flatten(1)


def _ascent(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, steps: int, step_size: float,
            box: tuple[float, float] | None) -> torch.Tensor:
    """ℓ2-normalised gradient ascent on fn(x) (one value per row), projected onto the box."""
    for _ in range(steps):
        x = x.detach().requires_grad_(True)
        with torch.enable_grad():
            (g,) = torch.autograd.grad(fn(x).sum(), x)
        with torch.no_grad():
            norm = g.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, *([1] * (g.dim() - 1)))
            x = x + step_size * g / norm
            if box is not None:
                x = x.clamp(*box)
    return x.detach()


def unit_inversion(model: nn.Module, layer: str, units: list[int], input_shape: tuple[int, ...], steps: int = 128,
                   step_size: float = 0.05, x0: float = 0.5, box: tuple[float, float] | None = (0.0, 1.0)
                   ) -> torch.Tensor:
    """Visualise units by inversion: inputs that maximise each unit (activation maximisation), by ℓ2-normalised
    projected gradient steps from a grey seed. Uses :func:`modelward.privacy.inversion.invert` (loss = −unit)
    when the privacy area is installed, else the same recipe here.

    Args:
        model: the model; layer: the layer; units: the unit (channel) indices to visualise.
        input_shape: one input's shape (no batch); steps / step_size: the ascent; x0: the grey seed value;
        box: the input range kept (None: unbounded).

    Returns:
        One input per unit: a tensor (len(units), *input_shape).

    Example:
        >>> net = nn.Sequential()
        >>> net.add_module("fc1", nn.Linear(4, 8)); net.add_module("act", nn.ReLU())
        >>> net.add_module("logits", nn.Linear(8, 3))
        >>> x = torch.randn(5, 4)
        >>> tuple(unit_inversion(net, "fc1", [0, 5], input_shape=(4,), steps=8).shape)
        (2, 4)
    """
    wrapped = _UnitOutput(model, layer)
    try:
        # lazy and optional: without the privacy area, the plain gradient ascent below is used
        from modelward.privacy.inversion import invert
    except ImportError:
        invert = None  # type: ignore[assignment]
    if invert is not None:
        return invert(wrapped, units, x0=x0, input_shape=input_shape, steps=steps, step_size=step_size,
                      loss="neg_logit", step="l2", box=box).x
    dev = model_device(model)
    dtype = next(model.parameters()).dtype
    idx = torch.as_tensor(units, device=dev)
    x = torch.full((len(units), *input_shape), float(x0), device=dev, dtype=dtype)
    with eval_mode(model):
        return _ascent(lambda v: wrapped(v).gather(1, idx[:, None])[:, 0], x, steps, step_size, box)


def _cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = a.flatten(1).double(), b.flatten(1).double()
    return (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1)).clamp_min(1e-30)


def _rank(v: torch.Tensor) -> torch.Tensor:
    return v.argsort(1).argsort(1).double()


def compare_models(models: dict[str, nn.Module], x: torch.Tensor, target: torch.Tensor | int,
                   method: Method = "integrated_gradients", steps: int = 64, batch_size: int | None = None
                   ) -> tuple[dict[str, torch.Tensor], list[dict[str, float | str]]]:
    """Explain the same inputs with several models (e.g. standard vs GloRo net, §3.3 / Ch. 5–6) and measure how
    alike their explanations are.

    Args:
        models: name -> model (at least one); x: the inputs.
        target: a class index, or a tensor of one class per input.
        method: the attribution method; steps: path steps; batch_size: rows per pass.

    Example:
        >>> net = nn.Sequential()
        >>> net.add_module("fc1", nn.Linear(4, 8)); net.add_module("act", nn.ReLU())
        >>> net.add_module("logits", nn.Linear(8, 3))
        >>> x = torch.randn(5, 4)
        >>> attrs, rows = compare_models({"a": net, "b": net}, x, target=1, steps=8)
        >>> sorted(attrs)
        ['a', 'b']

    Returns:
        (attributions per model, rows of pairwise similarity: mean cosine and mean Spearman rank correlation of the
        per-input attribution maps, and each model's attribution mass on the top-10% pixels).
    """
    if len(models) < 1:
        raise ConfigError("compare_models: need at least one model")
    qoi: QuantityOfInterest | int
    if isinstance(target, torch.Tensor):
        qoi = ClassQoI(tuple(int(t) for t in target.tolist()))
    else:
        qoi = target
    attrs = {name: attribute(m, x, qoi, method, steps=steps, batch_size=batch_size).detach().cpu()
             for name, m in models.items()}
    names = list(attrs)
    rows: list[dict[str, float | str]] = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            cos = _cosine(attrs[a], attrs[b]).mean().item()
            ra, rb = _rank(attrs[a].flatten(1)), _rank(attrs[b].flatten(1))
            spear = _cosine(ra - ra.mean(1, keepdim=True), rb - rb.mean(1, keepdim=True)).mean().item()
            rows.append({"model_a": a, "model_b": b, "cosine": cos, "spearman": spear})
    return attrs, rows


def concentration(attr: torch.Tensor, fraction: float = 0.1) -> torch.Tensor:
    """Share of the total |attribution| carried by the top ``fraction`` of input features, per input (a simple
    "how focused is the explanation" statistic for comparing models)."""
    a = attr.flatten(1).abs()
    k = max(1, int(round(fraction * a.shape[1])))
    return a.topk(k, dim=1).values.sum(1) / a.sum(1).clamp_min(1e-30)
