"""Black-box recovery of a ReLU network's boundary hyperplanes (seed 002 §8.6.2, after Rolnick & Kording 2020).

A ReLU network is piecewise linear: its input space is cut into linear regions by the boundaries where a neuron
switches on or off. A first-layer neuron i switches on the hyperplane wᵢᵀx + bᵢ = 0, so finding such boundaries
from queries alone reveals the first layer's weight columns — the overt encoding of §8.6, which for
over-parameterised robust nets can be whole training instances. The attack, for an output that is a scalar
(a fixed random projection of the logits):

1. **Find a boundary** on a line segment [a, b]: the function is linear on the segment iff f(mid) equals the mean
   of f(a) and f(b) (up to float64 noise); otherwise bisect towards a half that is not linear until the segment is
   shorter than `tol` — its midpoint p lies on a boundary.
2. **Estimate its normal**: the gradient of f jumps across the boundary by a multiple of the boundary's normal
   (for a first-layer neuron: of wᵢ). Both one-sided gradients are estimated by finite differences at p ± δ·u (u the
   search direction), d + 1 queries each; the normal is their difference, normalised.

Every call of the model is counted (``queries``). The thesis reports a mean cosine similarity of 0.98 between
original and recovered columns and ≈ 1,600 queries per recovered hyperplane.

Example:
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3)).double()
    >>> rec = HyperplaneRecovery(net, input_dim=4, seed=0)
    >>> found = rec.recover(lines=20)
    >>> rec.queries > 0
    True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class Hyperplane:
    """One recovered boundary: a point on it, its unit normal (sign arbitrary) and the queries it took."""

    point: np.ndarray
    normal: np.ndarray
    queries: int


class HyperplaneRecovery:
    """Find boundary hyperplanes of a ReLU network from input → output queries only.

    Args:
        model: the black box (any module mapping a batch of inputs to outputs); only ``model(x)`` is called.
        input_dim: d, the number of input features (inputs are flat vectors).
        box: the input range lines are drawn in.
        tol: the length below which a bisected segment is taken as a point on the boundary.
        delta: how far from the boundary (along the search line) the two one-sided gradients are taken.
        seed: seeds the random lines and the output projection.

    Returns:
        :meth:`recover` returns the :class:`Hyperplane` list; :attr:`queries` counts the inputs sent.
    """

    def __init__(self, model: nn.Module, input_dim: int, box: tuple[float, float] = (-1.0, 1.0),
                 tol: float = 1e-7, delta: float = 1e-4, seed: int = 0) -> None:
        self.model, self.d, self.box, self.tol, self.delta = model, input_dim, box, tol, delta
        self.rng = np.random.default_rng(seed)
        self.queries = 0
        self._proj: np.ndarray | None = None

    @torch.no_grad()
    def f(self, x: np.ndarray) -> np.ndarray:
        """The scalar output for each row of ``x`` (a random projection of the model's outputs); counts queries."""
        x = np.atleast_2d(x)
        self.queries += len(x)
        p = next(self.model.parameters(), None)
        dtype = p.dtype if p is not None else torch.float64
        out = self.model(torch.as_tensor(x, dtype=dtype)).double().reshape(len(x), -1).numpy()
        if self._proj is None:
            self._proj = self.rng.standard_normal(out.shape[1])
        return out @ self._proj

    def _linear(self, a: np.ndarray, b: np.ndarray, fa: float, fb: float) -> tuple[bool, float]:
        fm = float(self.f((a + b) / 2)[0])
        scale = max(1.0, abs(fa), abs(fb))
        return abs(fm - (fa + fb) / 2) <= 1e-11 * scale, fm  # float64 noise is ~1e-15: a kink shows well above it

    def boundaries_on(self, a: np.ndarray, b: np.ndarray, max_depth: int = 60) -> list[np.ndarray]:
        """Points on boundaries crossed by the segment [a, b] (bisection; a region crossed twice may hide)."""
        fa, fb = (float(v) for v in self.f(np.stack([a, b])))
        found: list[np.ndarray] = []
        stack = [(a, b, fa, fb, 0)]
        while stack:
            lo, hi, flo, fhi, depth = stack.pop()
            linear, fm = self._linear(lo, hi, flo, fhi)
            if linear:
                continue
            if np.linalg.norm(hi - lo) < self.tol or depth >= max_depth:
                found.append((lo + hi) / 2)
                continue
            mid = (lo + hi) / 2
            stack.append((lo, mid, flo, fm, depth + 1))
            stack.append((mid, hi, fm, fhi, depth + 1))
        return found

    def _gradient(self, x: np.ndarray) -> np.ndarray:
        h = self.delta * 1e-3  # much smaller than the distance to the boundary, so no step crosses it
        pts = np.vstack([x, x + h * np.eye(self.d)])
        v = self.f(pts)
        return (v[1:] - v[0]) / h

    def normal_at(self, p: np.ndarray, direction: np.ndarray) -> np.ndarray | None:
        """The unit normal of the boundary through `p` crossed along `direction` (None if no gradient jump)."""
        u = direction / np.linalg.norm(direction)
        jump = self._gradient(p + self.delta * u) - self._gradient(p - self.delta * u)
        n = np.linalg.norm(jump)
        return None if n < 1e-9 else jump / n

    def recover(self, lines: int = 50) -> list[Hyperplane]:
        """Cross the box with `lines` random lines and recover the hyperplane at every boundary point found."""
        lo, hi = self.box
        out: list[Hyperplane] = []
        for _ in range(lines):
            a = self.rng.uniform(lo, hi, self.d)
            b = self.rng.uniform(lo, hi, self.d)
            for p in self.boundaries_on(a, b):
                q0 = self.queries
                normal = self.normal_at(p, b - a)
                if normal is not None:
                    out.append(Hyperplane(p, normal, self.queries - q0))
        return out


def match_columns(recovered: list[Hyperplane], weight: torch.Tensor) -> np.ndarray:
    """For each true first-layer unit (row i of an ``nn.Linear`` weight, i.e. the column wᵢ of x·W), the best
    |cosine| between wᵢ and any recovered normal — 1.0 means the unit's hyperplane was recovered exactly."""
    w = weight.detach().double().numpy()
    w = w / np.linalg.norm(w, axis=1, keepdims=True)
    if not recovered:
        return np.zeros(len(w))
    n = np.stack([h.normal for h in recovered])
    return np.abs(w @ n.T).max(1)
