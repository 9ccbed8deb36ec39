"""Distributions of interest 𝒟 (seed 002 §3.2, Eq. 3.2): weighted sample sets over the input space or the slice's
latent space (a point, a straight-line path with a quadrature rule, a Gaussian, a data set, a mixture)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from modelward.errors import ConfigError

Space = Literal["input", "slice"]
PathRule = Literal["riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "gausslegendre"]
PATH_RULES: tuple[str, ...] = ("riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "gausslegendre")


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


def _as_input_space(doi: DistributionOfInterest) -> DistributionOfInterest:
    if isinstance(doi, LinearDoI):
        return LinearDoI(doi.baseline_value, doi.steps, doi.rule, "input", "input")
    if isinstance(doi, GaussianDoI):
        return GaussianDoI(doi.std, doi.samples, doi.seed, "input")
    doi.space = "input"
    return doi


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
