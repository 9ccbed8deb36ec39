"""Internal influence χ(g∘h, q, 𝒟) = E_{x∼𝒟}[∇_z (q∘g)(h(x))] (seed 002 Def. 3.2, Eq. 3.1–3.2).

The three parameters of the explanation are objects:

- a :class:`Slice` ``f = g ∘ h`` cut at a module of any ``nn.Module`` (addressed by its module name, as the zoo's
  parts are: ``conv2``, ``fc1``, ``layer3.0``; ``None`` = the input), optionally with a second cut ``to_layer`` whose
  output the quantity of interest reads (the feature-localisation slice (h, h') of §3.3);
- a :class:`QuantityOfInterest` ``q`` (a class logit, a logit difference, the top logit, an internal unit or
  channel, any function of the output);
- a :class:`DistributionOfInterest` 𝒟 (a point, a straight-line path from a baseline with a chosen number of steps
  and quadrature rule, a Gaussian around the point, a fixed data set, or a mixture of those), given either over the
  input space or directly over the slice's latent space.

The estimator is Eq. 3.2: the DoI is a weighted sample set, and χ is the weighted mean of the gradients at the
slice, computed in batches of ``batch_size`` rows (one forward and one backward per batch, on the model's device).
Below an internal slice the forward pass runs without autograd book-keeping (only ``g`` needs a graph), which is
why this is cheaper than differentiating the whole network.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn

from modelward.core.modules import eval_mode, model_device
from modelward.core.slicing import (
    Cut,
    Interception,
    StopForward,
    intercept,
    resolve_module,
)
from modelward.errors import ConfigError

Space = Literal["input", "slice"]
PathRule = Literal["riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "gausslegendre"]
PATH_RULES: tuple[str, ...] = ("riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "gausslegendre")


# ------------------------------------------------------------------------------------------------------------
# slices (module names are resolved by modelward.core.slicing.resolve_module)
@dataclass(frozen=True)
class Slice:
    """A decomposition f = g ∘ h (Def. 3.1): ``from_layer`` is the module whose *output* is z = h(x)
    (``None`` = the input itself, h = identity); ``to_layer`` is the module whose output the quantity of interest
    reads (``None`` = the model output). ``Slice(None, "conv2")`` with a unit QoI localises an internal unit (§3.3).

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

    def check(self, model: nn.Module) -> None:
        for field, name in (("slice.from_layer", self.from_layer), ("slice.to_layer", self.to_layer)):
            if name is not None:
                resolve_module(model, name, field)
        if self.from_layer is not None and self.from_layer == self.to_layer:
            raise ConfigError("slice: from_layer and to_layer are the same module; the QoI must be above the slice")


# ------------------------------------------------------------------------------------------------------------
# quantities of interest
class QuantityOfInterest(ABC):
    """q: output (or a layer's output) → one number per row (§3.2). ``rows`` holds, for each row of ``y``, the
    index of the explained input it belongs to (so per-input targets work on the batched DoI samples).

    Args:
        (subclasses) their own parameters; calling takes ``y`` (outputs, one row per sample) and ``rows``.

    Returns:
        Calling it returns a tensor (N,): one number per row of ``y``.

    Example:
        >>> q = ClassQoI(1)
        >>> isinstance(q, QuantityOfInterest), q(torch.tensor([[0.0, 2.0]]), torch.tensor([0])).tolist()
        (True, [2.0])
    """

    @abstractmethod
    def __call__(self, y: torch.Tensor, rows: torch.Tensor) -> torch.Tensor: ...


def _per_row(c: int | Sequence[int] | torch.Tensor, rows: torch.Tensor) -> torch.Tensor | int:
    if isinstance(c, int):
        return c
    t = torch.as_tensor(c, dtype=torch.long, device=rows.device)
    return t[rows]


def _pick(y: torch.Tensor, c: torch.Tensor | int) -> torch.Tensor:
    y = y.flatten(1)
    if isinstance(c, int):
        if not -y.shape[1] <= c < y.shape[1]:
            raise ConfigError(f"quantity of interest: class/unit {c} out of range; the output has {y.shape[1]} units")
        return y[:, c]
    if int(c.max()) >= y.shape[1] or int(c.min()) < 0:
        raise ConfigError(f"quantity of interest: class/unit out of range; the output has {y.shape[1]} units")
    return y.gather(1, c[:, None])[:, 0]


@dataclass(frozen=True)
class ClassQoI(QuantityOfInterest):
    """q(y) = y_c: the logit of class ``c`` (one class, or one class per explained input).

    Args:
        c: a class index, or a tuple of one class per explained input.

    Returns:
        Calling ``q(y, rows)`` returns y_c per row (``ConfigError`` if ``c`` is out of range).

    Example:
        >>> ClassQoI((0, 1))(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([0, 1])).tolist()
        [1.0, 4.0]
    """

    c: int | tuple[int, ...]

    def __call__(self, y: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return _pick(y, _per_row(self.c, rows))


@dataclass(frozen=True)
class ComparativeQoI(QuantityOfInterest):
    """q(y) = y_{c1} − y_{c2}: "why c1 rather than c2" (§3.2).

    Args:
        c1 / c2: the two classes (an index, or one per explained input).

    Returns:
        Calling ``q(y, rows)`` returns y_{c1} − y_{c2} per row.

    Example:
        >>> ComparativeQoI(1, 0)(torch.tensor([[1.0, 3.0]]), torch.tensor([0])).tolist()
        [2.0]
    """

    c1: int | tuple[int, ...]
    c2: int | tuple[int, ...]

    def __call__(self, y: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return _pick(y, _per_row(self.c1, rows)) - _pick(y, _per_row(self.c2, rows))


@dataclass(frozen=True)
class MaxClassQoI(QuantityOfInterest):
    """q(y) = max_i y_i (the predicted class's logit at each sample).

    Args:
        (none)

    Returns:
        Calling ``q(y, rows)`` returns the largest output per row.

    Example:
        >>> MaxClassQoI()(torch.tensor([[1.0, 3.0], [5.0, 0.0]]), torch.tensor([0, 1])).tolist()
        [3.0, 5.0]
    """

    def __call__(self, y: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return y.flatten(1).max(1).values


@dataclass(frozen=True)
class UnitQoI(QuantityOfInterest):
    """q(z) = z_i: one internal unit (flat index into the layer output), for feature localisation (§3.3).

    Args:
        unit: the flat index into the layer's output.

    Returns:
        Calling ``q(z, rows)`` returns z_unit per row.

    Example:
        >>> UnitQoI(2)(torch.tensor([[1.0, 2.0, 7.0]]), torch.tensor([0])).tolist()
        [7.0]
    """

    unit: int

    def __call__(self, y: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return _pick(y, self.unit)


@dataclass(frozen=True)
class ChannelQoI(QuantityOfInterest):
    """q(z) = Σ_{spatial} z_{c,·,·}: one channel of a convolutional layer (TruLens' internal-channel QoI).

    Args:
        channel: the channel index (``ConfigError`` if out of range).

    Returns:
        Calling ``q(z, rows)`` returns the channel's spatial sum per row.

    Example:
        >>> ChannelQoI(1)(torch.ones(2, 3, 4, 4), torch.tensor([0, 1])).tolist()
        [16.0, 16.0]
    """

    channel: int

    def __call__(self, y: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        if y.dim() < 2 or not 0 <= self.channel < y.shape[1]:
            raise ConfigError(f"quantity of interest: channel {self.channel} out of range for output {tuple(y.shape)}")
        return y[:, self.channel].reshape(len(y), -1).sum(1)


class LambdaQoI(QuantityOfInterest):
    """Any user function of the output: ``fn(y) -> (N,)`` or ``fn(y, rows) -> (N,)``.

    Args:
        fn: the function (one or two parameters); it must return one value per row (else ``ConfigError``).

    Returns:
        Calling ``q(y, rows)`` returns ``fn``'s values.

    Example:
        >>> LambdaQoI(lambda y: y.sum(1))(torch.tensor([[1.0, 2.0]]), torch.tensor([0])).tolist()
        [3.0]
    """

    def __init__(self, fn: Callable[..., torch.Tensor]) -> None:
        self.fn = fn
        try:
            self._two = len(inspect.signature(fn).parameters) >= 2
        except (TypeError, ValueError):
            self._two = False

    def __call__(self, y: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        out = self.fn(y, rows) if self._two else self.fn(y)
        if out.dim() != 1 or out.shape[0] != y.shape[0]:
            raise ConfigError(f"quantity of interest: the function must return one value per row, got {tuple(out.shape)}")
        return out


# ------------------------------------------------------------------------------------------------------------
# distributions of interest
def path_alphas(steps: int, rule: str) -> tuple[np.ndarray, np.ndarray]:
    """Points α ∈ [0, 1] and weights of the quadrature of ∫_0^1 · dα (the same rules and formulas as Captum's
    ``approximation_parameters``, so straight-line paths agree with it exactly). Weights sum to 1."""
    if steps < 1:
        raise ConfigError(f"doi.steps: must be >= 1, got {steps}")
    if rule == "gausslegendre":
        x, w = np.polynomial.legendre.leggauss(steps)
        return 0.5 * (x + 1.0), 0.5 * w
    if rule not in PATH_RULES:
        raise ConfigError(f"doi.rule: {rule!r} is not a path rule; valid choices: {', '.join(PATH_RULES)}")
    if rule == "riemann_trapezoid":
        if steps < 2:
            raise ConfigError("doi.steps: the trapezoid rule needs at least 2 steps")
        a = np.linspace(0.0, 1.0, steps)
        w = np.full(steps, 1.0 / (steps - 1))
        w[0] = w[-1] = 0.5 / (steps - 1)
        return a, w
    shift = {"riemann_left": 0.0, "riemann_right": 1.0, "riemann_middle": 0.5}[rule]
    return (np.arange(steps) + shift) / steps, np.full(steps, 1.0 / steps)


def _baseline_like(baseline: torch.Tensor | float | None, x: torch.Tensor) -> torch.Tensor:
    if baseline is None:
        return torch.zeros_like(x)
    b = torch.as_tensor(baseline, dtype=x.dtype, device=x.device)
    try:
        return torch.broadcast_to(b, x.shape)
    except RuntimeError:
        raise ConfigError(f"baseline of shape {tuple(b.shape)} does not broadcast to the inputs {tuple(x.shape)}") from None


class DistributionOfInterest(ABC):
    """𝒟 as a weighted sample set (Eq. 3.2). ``space`` says where the samples live: the model's input, or the
    slice's latent space z = h(x) ("a DoI may be expressed directly over the latent space", §3.2).

    Args:
        (subclasses) their own parameters; ``sample(x, baseline=None)`` takes the B explained points.

    Returns:
        ``sample`` returns samples (S, B, *shape) and weights (S,) summing to 1; ``baseline(x)`` the reference
        point of attributions (default 0).

    Example:
        >>> pts, w = PointDoI().sample(torch.ones(2, 3))
        >>> isinstance(PointDoI(), DistributionOfInterest), tuple(pts.shape), w.tolist()
        (True, (1, 2, 3), [1.0])
    """

    space: Space = "input"

    @abstractmethod
    def sample(self, x: torch.Tensor, baseline: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples (S, B, *shape) around the B points `x` (input or latent), and weights (S,) summing to 1.
        `baseline` (same shape as x) overrides the DoI's own reference point where it has one."""

    def baseline(self, x: torch.Tensor) -> torch.Tensor:
        """The reference point an attribution is measured from (influence × (z − baseline)); default 0."""
        return torch.zeros_like(x)


@dataclass(frozen=True)
class PointDoI(DistributionOfInterest):
    """The point mass at x: the most local explanation (saliency maps, §3.4). Baseline for attributions: 0
    (gradient × input).

    Args:
        space: ``"input"`` or ``"slice"`` (the latent space of the slice).

    Returns:
        ``sample(x)`` returns ``x`` itself as one sample of weight 1.

    Example:
        >>> tuple(PointDoI().sample(torch.ones(2, 3))[0].shape)
        (1, 2, 3)
    """

    space: Space = "input"

    def sample(self, x: torch.Tensor, baseline: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return x[None], torch.ones(1, dtype=x.dtype, device=x.device)


@dataclass(frozen=True)
class LinearDoI(DistributionOfInterest):
    """Uniform on the segment from ``baseline`` to x (integrated gradients, Eq. 3.3), discretised with ``steps``
    points by ``rule``. With ``space="slice"`` the path runs in the latent space between h(baseline) and h(x)
    (Captum's ``LayerIntegratedGradients``); ``baseline`` is an input-space tensor/number (None = zeros) unless
    ``baseline_space="slice"``.

    Args:
        baseline_value: the path's start (tensor or number; None = zeros).
        steps: points on the path; rule: the quadrature rule (default ``"gausslegendre"``; validated early).
        space: ``"input"`` or ``"slice"``; baseline_space: where ``baseline_value`` lives.

    Returns:
        ``sample(x)`` returns ``steps`` points between the baseline and ``x`` with quadrature weights summing to 1.

    Example:
        >>> pts, w = LinearDoI(steps=8).sample(torch.ones(2, 3))
        >>> tuple(pts.shape), round(float(w.sum()), 6)
        ((8, 2, 3), 1.0)
    """

    baseline_value: torch.Tensor | float | None = None
    steps: int = 50
    rule: str = "gausslegendre"
    space: Space = "input"
    baseline_space: Space = "input"

    def __post_init__(self) -> None:
        path_alphas(self.steps, self.rule)  # validates steps and rule early

    def sample(self, x: torch.Tensor, baseline: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        a, w = path_alphas(self.steps, self.rule)
        base = self.baseline(x) if baseline is None else baseline
        alphas = torch.as_tensor(a, dtype=x.dtype, device=x.device).view(-1, *([1] * x.dim()))
        return base[None] + alphas * (x - base)[None], torch.as_tensor(w, dtype=x.dtype, device=x.device)

    def baseline(self, x: torch.Tensor) -> torch.Tensor:
        return _baseline_like(self.baseline_value, x)


@dataclass(frozen=True)
class GaussianDoI(DistributionOfInterest):
    """x + N(0, std²) samples (SmoothGrad, §3.4); ``samples`` draws, seeded (no global RNG).

    Args:
        std: the noise standard deviation (≥ 0, input units); samples: draws (≥ 1); seed: the noise seed.
        space: ``"input"`` or ``"slice"``.

    Returns:
        ``sample(x)`` returns ``samples`` noisy copies of ``x`` with equal weights.

    Example:
        >>> pts, w = GaussianDoI(std=0.1, samples=5).sample(torch.zeros(2, 3))
        >>> tuple(pts.shape), round(float(w.sum()), 6)
        ((5, 2, 3), 1.0)
    """

    std: float = 0.15
    samples: int = 50
    seed: int = 0
    space: Space = "input"

    def __post_init__(self) -> None:
        if self.std < 0 or self.samples < 1:
            raise ConfigError(f"doi: GaussianDoI needs std >= 0 and samples >= 1, got {self.std}, {self.samples}")

    def sample(self, x: torch.Tensor, baseline: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        # drawn on the CPU and moved: the same seed gives the same noise on every device
        g = torch.Generator(device="cpu").manual_seed(self.seed)
        noise = torch.randn((self.samples, *x.shape), generator=g, dtype=torch.float64)
        pts = x[None] + self.std * noise.to(device=x.device, dtype=x.dtype)
        return pts, torch.full((self.samples,), 1.0 / self.samples, dtype=x.dtype, device=x.device)


class DatasetDoI(DistributionOfInterest):
    """A fixed multiset of points (a data set: the "zoomed-out", global explanation of Eq. 3.2), optionally
    weighted. It does not depend on the explained point: the influence comes back with batch size 1.

    Args:
        points: the points (N, *shape), at least one.
        weights: one non-negative weight per point, not all zero (default: uniform; normalised to sum 1).
        space: ``"input"`` or ``"slice"``.

    Returns:
        ``sample(x)`` returns the points (N, 1, *shape) and their weights, whatever ``x`` is.

    Example:
        >>> doi = DatasetDoI(torch.zeros(4, 3), weights=torch.tensor([1.0, 1.0, 2.0, 0.0]))
        >>> doi.weights.tolist()
        [0.25, 0.25, 0.5, 0.0]
    """

    def __init__(self, points: torch.Tensor, weights: torch.Tensor | None = None, space: Space = "input") -> None:
        if len(points) == 0:
            raise ConfigError("doi: DatasetDoI needs at least one point")
        self.points = points
        w = torch.ones(len(points), dtype=torch.float64) if weights is None else torch.as_tensor(weights).double()
        if w.shape != (len(points),) or bool((w < 0).any()) or float(w.sum()) <= 0:
            raise ConfigError("doi: DatasetDoI weights must be one non-negative weight per point, not all zero")
        self.weights = w / w.sum()
        self.space = space

    def sample(self, x: torch.Tensor, baseline: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        pts = self.points.to(device=x.device, dtype=x.dtype)
        return pts[:, None], self.weights.to(device=x.device, dtype=x.dtype)


class MixtureDoI(DistributionOfInterest):
    """𝒟 = Σ_a α_a P_a (Axiom 4.3, distributional linearity): the union of the components' samples, each
    component's weights scaled by its α. Components must live in the same space and depend on x alike.

    Args:
        components: ``(α, DoI)`` pairs; the α are non-negative, not all zero, and normalised to sum 1.

    Returns:
        ``sample(x)`` returns the union of the components' samples with weights scaled by their α.

    Example:
        >>> mix = MixtureDoI([(1.0, PointDoI()), (3.0, LinearDoI(steps=4))])
        >>> pts, w = mix.sample(torch.ones(2, 3))
        >>> tuple(pts.shape), round(float(w.sum()), 6)
        ((5, 2, 3), 1.0)
    """

    def __init__(self, components: Sequence[tuple[float, DistributionOfInterest]]) -> None:
        if not components:
            raise ConfigError("doi: a mixture needs at least one component")
        spaces = {d.space for _, d in components}
        if len(spaces) != 1:
            raise ConfigError("doi: mixture components must all be over the input or all over the slice")
        total = sum(a for a, _ in components)
        if total <= 0 or any(a < 0 for a, _ in components):
            raise ConfigError("doi: mixture weights must be non-negative and not all zero")
        self.components = [(a / total, d) for a, d in components]
        self.space = spaces.pop()

    def sample(self, x: torch.Tensor, baseline: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        parts = [d.sample(x, baseline) for _, d in self.components]
        batch = max(p.shape[1] for p, _ in parts)
        pts = torch.cat([p.expand(p.shape[0], batch, *p.shape[2:]) for p, _ in parts])
        w = torch.cat([a * wi for (a, _), (_, wi) in zip(self.components, parts, strict=True)])
        return pts, w


# ------------------------------------------------------------------------------------------------------------
@contextmanager
def intercept_qoi(model: nn.Module, to_layer: str | None) -> Iterator[Interception]:
    """Record the (last) output of the QoI's module `to_layer`; nothing when the QoI reads the model output."""
    seen = Interception()
    if to_layer is None:
        yield seen
        return

    def at_qoi(_m: nn.Module, _i: object, out: torch.Tensor) -> None:
        seen.calls += 1
        seen.value = out

    handle = resolve_module(model, to_layer).register_forward_hook(at_qoi)
    try:
        yield seen
    finally:
        handle.remove()


class InternalInfluence:
    """χ(g∘h, q, 𝒟) of Def. 3.2, estimated by Eq. 3.2 in batches.

    Args:
        model: any ``nn.Module`` mapping a batch of inputs to outputs (put in eval mode while explaining).
        slice: where to cut (:class:`Slice`, a layer name, or ``None`` for the input).
        qoi: a :class:`QuantityOfInterest`, a class index, a ``(c1, c2)`` pair, ``"max"``, or a callable.
        doi: a :class:`DistributionOfInterest` (default: the point; ``"point"`` / ``"linear"`` also accepted).
        batch_size: most rows (DoI samples × inputs) per forward/backward pass (None = all at once); the
            default 4096 keeps activations cache- and memory-friendly without changing the result.

    Returns:
        :meth:`influence` gives E_𝒟[∇_z q∘g] with the shape of z (per explained input); :meth:`attribution` gives
        influence ⊙ (z − z_baseline) (§3.1's units of output; completeness along a path, Eq. 3.3).

    Example:
        >>> net = nn.Sequential()
        >>> net.add_module("fc1", nn.Linear(4, 8)); net.add_module("act", nn.ReLU())
        >>> net.add_module("logits", nn.Linear(8, 3))
        >>> ii = InternalInfluence(net, Slice("fc1"), ClassQoI(2), LinearDoI(steps=16))
        >>> tuple(ii.influence(torch.randn(5, 4)).shape)  # (B, 8) for the 8-unit fc1
        (5, 8)
    """

    def __init__(self, model: nn.Module, slice: Slice | str | None = None,
                 qoi: QuantityOfInterest | int | tuple[int, int] | str | Callable[..., torch.Tensor] = "max",
                 doi: DistributionOfInterest | str | None = None, batch_size: int | None = 4096) -> None:
        self.model = model
        self.slice = slice if isinstance(slice, Slice) else Slice(slice)
        self.slice.check(model)
        self.qoi = as_qoi(qoi)
        self.doi = as_doi(doi)
        if batch_size is not None and batch_size < 1:
            raise ConfigError(f"batch_size: must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        if self.slice.from_layer is None and self.doi.space == "slice":
            # at the input slice the latent space *is* the input space
            self.doi = _as_input_space(self.doi)

    # -- activations --------------------------------------------------------------------------------------
    def _run(self, inp: torch.Tensor, replace: torch.Tensor | None, want_grad: bool
             ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """One forward pass. Returns (z leaf, q-input y). With `replace`, the slice's output is replaced by it
        (a latent-space DoI); without `want_grad`, the pass stops at the slice and y is None."""
        model, sl = self.model, self.slice
        captured: dict[str, torch.Tensor] = {}
        if sl.from_layer is None:
            with intercept_qoi(model, sl.to_layer) as q:
                leaf = inp.detach().requires_grad_(want_grad)
                with torch.set_grad_enabled(want_grad):
                    y = model(leaf)
            return leaf, (y if sl.to_layer is None else q.check_called(Cut(sl.to_layer, field="slice.to_layer")))

        def at_slice(out: torch.Tensor) -> torch.Tensor:
            z = (replace if replace is not None else out).detach()
            if not want_grad:
                captured["z"] = z
                raise StopForward
            # only g needs a graph: autograd was off below the slice and is switched on here
            torch.set_grad_enabled(True)
            z = z.requires_grad_(True)
            captured["z"] = z
            return z.clone()  # a non-leaf, so in-place activations above the slice are allowed

        cut = Cut(sl.from_layer)
        y: torch.Tensor | None
        with intercept_qoi(model, sl.to_layer) as q, intercept(model, cut, at_slice) as at:
            try:
                with torch.no_grad():
                    y = model(inp)
            except StopForward:
                y = None
        at.check_called(cut)
        if sl.to_layer is not None and y is not None:
            y = q.check_called(Cut(sl.to_layer, field="slice.to_layer"))
        return captured["z"], y

    @torch.no_grad()
    def activation(self, x: torch.Tensor) -> torch.Tensor:
        """z = h(x) for a batch of inputs (the input itself at the input slice)."""
        x = x.to(model_device(self.model))
        if self.slice.from_layer is None:
            return x
        with eval_mode(self.model):
            z, _ = self._run(x, None, want_grad=False)
        assert z is not None
        return z

    # -- the estimator ------------------------------------------------------------------------------------
    def _grad_mean(self, x: torch.Tensor) -> torch.Tensor:
        dev = model_device(self.model)
        x = x.to(dev)
        latent = self.doi.space == "slice" and self.slice.from_layer is not None
        if latent:
            pts, w = self.doi.sample(self.activation(x), self.baseline_activation(x))
        else:
            pts, w = self.doi.sample(x)
        n_s, n_b = pts.shape[0], pts.shape[1]
        flat = pts.reshape(n_s * n_b, *pts.shape[2:])
        rows = torch.arange(n_b, device=dev).repeat(n_s)
        row_w = w.repeat_interleave(n_b)
        step = self.batch_size or len(flat)
        acc: torch.Tensor | None = None
        with eval_mode(self.model):
            for i in range(0, len(flat), step):
                chunk, r = flat[i : i + step], rows[i : i + step]
                if latent:
                    # the model still needs inputs below the slice; their output is replaced by the samples
                    z, y = self._run(x[r] if x.shape[0] == n_b else x[:1].expand(len(r), *x.shape[1:]), chunk, True)
                else:
                    z, y = self._run(chunk, None, True)
                assert z is not None and y is not None
                q = self.qoi(y, r)
                g = torch.autograd.grad(q.sum(), z, allow_unused=True)[0] if q.requires_grad else None
                if g is None:
                    raise ConfigError("quantity of interest does not depend on the slice "
                                      "(is slice.to_layer below slice.from_layer?)")
                g = g * row_w[i : i + step].view(-1, *([1] * (g.dim() - 1)))
                if acc is None:
                    acc = torch.zeros((n_b, *g.shape[1:]), dtype=g.dtype, device=g.device)
                acc.index_add_(0, r, g)
        assert acc is not None
        return acc

    def influence(self, x: torch.Tensor) -> torch.Tensor:
        """χ: the DoI-weighted mean gradient of q∘g at the slice, one per explained input (Eq. 3.2)."""
        return self._grad_mean(x)

    def baseline_activation(self, x: torch.Tensor) -> torch.Tensor:
        """z at the DoI's baseline (h(baseline) for input-space baselines)."""
        x = x.to(model_device(self.model))
        doi = self.doi
        if isinstance(doi, LinearDoI) and doi.space == "slice" and doi.baseline_space == "slice":
            return doi.baseline(self.activation(x))
        return self.activation(doi.baseline(x))

    def attribution(self, x: torch.Tensor) -> torch.Tensor:
        """influence ⊙ (z − z_baseline) (§3.1 attribution; integrated gradients when 𝒟 is the straight path)."""
        infl = self._grad_mean(x)
        z = self.activation(x)
        return infl * (z - self.baseline_activation(x))

    def quantity(self, x: torch.Tensor) -> torch.Tensor:
        """q∘f at the points x (no gradient), e.g. for completeness checks: Σ attribution ≈ q(x) − q(baseline)."""
        x = x.to(model_device(self.model))
        with torch.no_grad(), eval_mode(self.model):
            if self.slice.to_layer is None:
                y = self.model(x)
            else:
                sl = Slice(None, self.slice.to_layer)
                _, y = InternalInfluence(self.model, sl, self.qoi)._run(x, None, want_grad=True)
                assert y is not None
                y = y.detach()
            return self.qoi(y, torch.arange(len(x), device=x.device))


def _as_input_space(doi: DistributionOfInterest) -> DistributionOfInterest:
    if isinstance(doi, LinearDoI):
        return LinearDoI(doi.baseline_value, doi.steps, doi.rule, "input", "input")
    if isinstance(doi, GaussianDoI):
        return GaussianDoI(doi.std, doi.samples, doi.seed, "input")
    doi.space = "input"
    return doi


def as_qoi(q: QuantityOfInterest | int | tuple[int, int] | str | Callable[..., torch.Tensor]) -> QuantityOfInterest:
    """Shorthands (as in TruLens): int → class logit, (c1, c2) → comparative, "max" → top logit, callable →
    :class:`LambdaQoI`."""
    if isinstance(q, QuantityOfInterest):
        return q
    if isinstance(q, bool):
        raise ConfigError("qoi: a boolean is not a quantity of interest; use a class index, (c1, c2), 'max'")
    if isinstance(q, int):
        return ClassQoI(q)
    if isinstance(q, tuple) and len(q) == 2 and all(isinstance(c, int) for c in q):
        return ComparativeQoI(q[0], q[1])
    if q == "max":
        return MaxClassQoI()
    if callable(q):
        return LambdaQoI(q)
    raise ConfigError(f"qoi: {q!r} is not a quantity of interest; use a class index, a (c1, c2) pair, 'max', "
                      "a callable or a QuantityOfInterest")


def as_doi(d: DistributionOfInterest | str | None) -> DistributionOfInterest:
    """Shorthands: None / "point" → :class:`PointDoI`, "linear" → :class:`LinearDoI` (50 Gauss–Legendre points)."""
    if isinstance(d, DistributionOfInterest):
        return d
    if d is None or d == "point":
        return PointDoI()
    if d == "linear":
        return LinearDoI()
    raise ConfigError(f"doi: {d!r} is not a distribution of interest; valid shorthands: 'point', 'linear' "
                      "(or pass a PointDoI / LinearDoI / GaussianDoI / DatasetDoI / MixtureDoI)")


def completeness_gap(ii: InternalInfluence, x: torch.Tensor) -> torch.Tensor:
    """Σ attribution − (q(x) − q(baseline)) per input (Eq. 3.3 efficiency); → 0 as the path resolution grows.

    Args:
        ii: an :class:`InternalInfluence` with a :class:`LinearDoI` (else ``ConfigError``).
        x: the explained inputs.

    Returns:
        The gap per input (B,).

    Example:
        >>> net = nn.Sequential()
        >>> net.add_module("fc1", nn.Linear(4, 8)); net.add_module("act", nn.ReLU())
        >>> net.add_module("logits", nn.Linear(8, 3))
        >>> ii = InternalInfluence(net, None, ClassQoI(0), LinearDoI(steps=64))
        >>> tuple(completeness_gap(ii, torch.randn(3, 4)).shape)  # small; → 0 with more steps
        (3,)
    """
    if not isinstance(ii.doi, LinearDoI):
        raise ConfigError("completeness is defined for a straight-line path DoI (LinearDoI)")
    attr = ii.attribution(x).flatten(1).sum(1)
    if ii.doi.space == "slice" and ii.slice.from_layer is not None:
        # q(baseline) must be evaluated with the slice's output set to z_baseline
        zb = ii.baseline_activation(x)
        with eval_mode(ii.model):
            _, y = ii._run(x.to(model_device(ii.model)), zb, True)
        assert y is not None
        qb = ii.qoi(y.detach(), torch.arange(len(x), device=zb.device))
    else:
        qb = ii.quantity(ii.doi.baseline(x.to(model_device(ii.model))))
    return attr - (ii.quantity(x) - qb)

