"""Label-only membership inference: the attacks that still work through a top-1 prediction API.

Both attacks see **only the predicted label** of their queries — a *top-1 API*, any callable ``api(x) -> labels``
(a local model through :func:`top1_api`, or a served model over HTTP) — and count their queries.

* ``boundary`` — decision-boundary distance (Choquette-Choo et al., ICML 2021, "Label-Only Membership Inference
  Attacks", §4.2; Li & Zhang, CCS 2021): members sit farther from the decision boundary. The distance is found
  with HopSkipJump (Chen, Jordan & Wainwright, S&P 2020), a label-only attack: start from a misclassified point
  (uniform noise in the data's range), binary-search the segment to the boundary, then ``iterations`` times:
  estimate the boundary's normal from ``grad_queries`` labels of random probes around the boundary point
  (Monte-Carlo sign estimate, Eq. 9 of HSJ with the baseline φ̄ subtracted), step along it (geometric step size
  ‖x_b − x‖/√t, halved until still misclassified) and binary-search back to the boundary. Score: the L2 distance
  from x to the boundary (0 when the API already gets x wrong: a non-member guess).
* ``augmentation`` — augmentation consistency (Choquette-Choo et al. 2021, §4.1): members keep their label under
  small perturbations: ``samples`` Gaussian perturbations of scale ``noise`` (input units; the default), or for
  images (N, C, H, W) with ``shift > 0`` every translation by up to ``shift`` pixels (zero fill; on 8×8 digits a
  one-pixel shift changes most labels of members and non-members alike: AUC 0.50 against 0.60 for noise). Score: the fraction of the augmented
  queries (and x itself) the API labels y.

Decision threshold: the ``quantile`` of the scores of the attacker's hold-out (non-member) points, so the
decisions' FPR is about 1 − ``quantile``; AUC, TPR at low FPR and the ε lower bound do not depend on it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from modelward.errors import ConfigError, DataError
from modelward.privacy.membership.base import AttackData, MembershipAttack

TopOneAPI = Callable[[torch.Tensor], torch.Tensor]


def top1_api(model: torch.nn.Module, batch: int = 4096) -> TopOneAPI:
    """A top-1 API over a local model: labels only, computed in eval mode without gradients.

    Example:
        >>> api = top1_api(torch.nn.Linear(4, 3))
        >>> api(torch.zeros(2, 4)).shape
        torch.Size([2])
    """

    def api(x: torch.Tensor) -> torch.Tensor:
        was = model.training
        model.eval()
        with torch.no_grad():
            out = torch.cat([model(x[i:i + batch]).argmax(1) for i in range(0, len(x), batch)]) if len(x) else (
                torch.zeros(0, dtype=torch.long))
        model.train(was)
        return out

    return api


class CountingAPI:
    """Wraps a top-1 API and counts the points it was asked about (the attack's query cost)."""

    def __init__(self, api: TopOneAPI) -> None:
        self.api, self.queries = api, 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.queries += len(x)
        labels = torch.as_tensor(self.api(x)).reshape(-1).long()
        if len(labels) != len(x):
            raise DataError(f"the top-1 API answered {len(labels)} labels for {len(x)} queries")
        return labels


class _LabelOnly(MembershipAttack):
    def __init__(self, api: TopOneAPI | None = None, quantile: float = 0.5, seed: int = 0) -> None:
        if not 0 < quantile < 1:
            raise ConfigError(f"{self.name}: quantile must lie in (0, 1), got {quantile}")
        if api is not None and not callable(api):
            raise ConfigError(f"{self.name}: api must be a callable x -> labels (from Python; a config leaves it "
                              f"out and the audit's target is queried through top1_api), got {type(api).__name__}")
        self.api = CountingAPI(api) if api is not None else None
        self.quantile, self.seed = quantile, seed

    def fit(self, data: AttackData) -> _LabelOnly:
        self.data = data
        if self.api is None:
            self.api = CountingAPI(top1_api(data.target))
        self.lo = float(data.x_aux.min())
        self.hi = float(data.x_aux.max())
        self.threshold = float(np.quantile(self.score(data.x_aux, data.y_aux), self.quantile))
        return self

    def _api(self) -> CountingAPI:
        if self.api is None:
            raise ConfigError(f"attack {self.name!r}: call fit(data) first (or pass api=)")
        return self.api


class BoundaryDistanceAttack(_LabelOnly):
    """HopSkipJump distance to the decision boundary, labels only (module doc).

    Args:
        api: the top-1 API (default: the target of ``fit``'s data, through :func:`top1_api`).
        iterations: HSJ iterations (gradient estimate + step + binary search) per point.
        grad_queries: probes per gradient estimate; binary_steps: bisection steps per boundary search.
        init_tries: random starting points tried to find a misclassified one.
        quantile: the hold-out score quantile used as decision threshold; seed: the probes' randomness.

    Returns:
        ``score(x, y)``: the distance to the boundary (higher = member); ``queries`` on the API.

    Example:
        >>> attack = BoundaryDistanceAttack(iterations=2).fit(data)   # doctest: +SKIP
        >>> attack.score(x, y)                                        # doctest: +SKIP
    """

    name = "boundary"

    def __init__(self, api: TopOneAPI | None = None, iterations: int = 4, grad_queries: int = 40,
                 binary_steps: int = 10, init_tries: int = 20, quantile: float = 0.5, seed: int = 0) -> None:
        super().__init__(api, quantile, seed)
        if min(iterations, grad_queries, binary_steps, init_tries) < 1:
            raise ConfigError("boundary: iterations, grad_queries, binary_steps and init_tries must be ≥ 1")
        self.iterations, self.grad_queries = iterations, grad_queries
        self.binary_steps, self.init_tries = binary_steps, init_tries

    def _bisect(self, x: torch.Tensor, adv: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Binary search on the segments x → adv (adv misclassified); returns points on the misclassified side."""
        lo = torch.zeros(len(x))
        hi = torch.ones(len(x))
        shape = (-1,) + (1,) * (x.dim() - 1)
        for _ in range(self.binary_steps):
            mid = (lo + hi) / 2
            wrong = self._api()(x + mid.view(shape) * (adv - x)) != y
            hi = torch.where(wrong, mid, hi)
            lo = torch.where(wrong, lo, mid)
        return x + hi.view(shape) * (adv - x)

    def score(self, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        api = self._api()
        g = torch.Generator().manual_seed(self.seed)
        x = x.float()
        n = len(x)
        if n == 0:
            return np.zeros(0)
        correct = api(x) == y
        dist = torch.zeros(n, dtype=torch.float64)
        idx = torch.nonzero(correct).reshape(-1)
        if len(idx) == 0:
            return dist.numpy()
        xs, ys = x[idx], y[idx]
        adv = xs.clone()
        found = torch.zeros(len(idx), dtype=torch.bool)
        for _ in range(self.init_tries):
            todo = torch.nonzero(~found).reshape(-1)
            if len(todo) == 0:
                break
            cand = self.lo + (self.hi - self.lo) * torch.rand(xs[todo].shape, generator=g)
            ok = api(cand) != ys[todo]
            adv[todo[ok]] = cand[ok]
            found[todo[ok]] = True
        if not found.any():
            dist[idx] = float("inf")
            return dist.numpy()
        sub = torch.nonzero(found).reshape(-1)
        xs_f, ys_f = xs[sub], ys[sub]
        xb = self._bisect(xs_f, adv[sub], ys_f)
        shape = (-1,) + (1,) * (x.dim() - 1)
        d = int(np.prod(xs.shape[1:]))
        for t in range(1, self.iterations + 1):
            radius = (xb - xs_f).flatten(1).norm(dim=1)
            probe = math.sqrt(d) * 1e-3 * radius.clamp_min(1e-6) / math.sqrt(t)  # HSJ's δ_t, scaled to ‖d_t‖
            u = torch.randn((len(sub), self.grad_queries, *xs.shape[1:]), generator=g)
            u = u / u.flatten(2).norm(dim=2).view(len(sub), self.grad_queries, *([1] * (x.dim() - 1)))
            pts = (xb[:, None] + probe.view(-1, 1, *([1] * (x.dim() - 1))) * u).clamp(self.lo, self.hi)
            wrong = api(pts.reshape(-1, *xs.shape[1:])).reshape(len(sub), self.grad_queries) != ys_f[:, None]
            phi = wrong.float() * 2 - 1
            phi = phi - phi.mean(1, keepdim=True)  # baseline (HSJ Eq. 16)
            grad = (phi.view(len(sub), self.grad_queries, *([1] * (x.dim() - 1))) * u).sum(1)
            grad = grad / grad.flatten(1).norm(dim=1).clamp_min(1e-12).view(shape)
            step = radius / math.sqrt(t)
            new = xb.clone()
            pending = torch.ones(len(sub), dtype=torch.bool)
            for _ in range(10):  # geometric step search: halve until the point stays misclassified
                cand = (xb + step.view(shape) * grad).clamp(self.lo, self.hi)
                ok = pending & (api(cand) != ys_f)
                new[ok] = cand[ok]
                pending &= ~ok
                step = step / 2
                if not pending.any():
                    break
            xb = self._bisect(xs_f, new, ys_f)
        dist_f = (xb - xs_f).flatten(1).norm(dim=1).double()
        inner = torch.full((len(idx),), float("inf"), dtype=torch.float64)
        inner[sub] = dist_f
        dist[idx] = inner
        return dist.numpy()


class AugmentationAttack(_LabelOnly):
    """Fraction of augmented queries labelled y (module doc).

    Args:
        api: the top-1 API (default: the fitted target through :func:`top1_api`).
        shift: images: every translation by up to ``shift`` pixels in each direction ((2·shift + 1)² queries);
            0 (default): Gaussian perturbations instead.
        samples / noise: other inputs: Gaussian perturbations (count, standard deviation in input units).
        quantile / seed: as :class:`BoundaryDistanceAttack`.

    Returns:
        ``score(x, y)`` in [0, 1] (higher = member).

    Example:
        >>> AugmentationAttack(shift=1).fit(data).score(x, y)   # doctest: +SKIP
    """

    name = "augmentation"

    def __init__(self, api: TopOneAPI | None = None, shift: int = 0, samples: int = 32, noise: float = 0.3,
                 quantile: float = 0.5, seed: int = 0) -> None:
        super().__init__(api, quantile, seed)
        if shift < 0 or samples < 1 or noise <= 0:
            raise ConfigError("augmentation: need shift ≥ 0, samples ≥ 1 and noise > 0")
        self.shift, self.samples, self.noise = shift, samples, noise

    def augmentations(self, x: torch.Tensor) -> torch.Tensor:
        """(A, N, …) augmented copies of x (the identity among them)."""
        if x.dim() == 4 and self.shift > 0:
            out = []
            s = self.shift
            for dy in range(-s, s + 1):
                for dx in range(-s, s + 1):
                    z = torch.zeros_like(x)
                    h, w = x.shape[2], x.shape[3]
                    z[:, :, max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = \
                        x[:, :, max(-dy, 0):h + min(-dy, 0), max(-dx, 0):w + min(-dx, 0)]
                    out.append(z)
            return torch.stack(out)
        g = torch.Generator().manual_seed(self.seed)
        noise = self.noise * torch.randn((self.samples, *x.shape), generator=g)
        return torch.cat([x[None], x[None] + noise])

    def score(self, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        api = self._api()
        aug = self.augmentations(x.float())
        labels = api(aug.reshape(-1, *x.shape[1:])).reshape(len(aug), len(x))
        return (labels == y[None]).double().mean(0).numpy()
