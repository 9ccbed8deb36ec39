"""``square_full``: a stronger variant of the Square Attack (Andriushchenko, Croce, Flammarion, Hein, ECCV 2020),
ℓ∞ (Algorithms 1–2) and ℓ2 (Algorithm 3), on the margin loss ``z_y − max_{i≠y} z_i``. AutoAttack's member is
:class:`modelward.robustness.attacks.square.Square`, which follows the reference code; this one differs from it where
the reference is weaker than the paper's algorithm (issue 38 item 3):

- a window may sit anywhere in the image, its last row and column included (the reference draws its corner from
  ``0 … h − s − 1``, so on 8×8 digits the last row and column are never changed after the initial stripes);
- each point draws its own signs per channel (the reference shares one draw across the batch);
- the ℓ2 budget of the two windows is measured over the whole image, not per channel.

It breaks more points than the reference (60 digits at L∞ ε = 0.1: 7–12 more), so a number computed with it is *not*
comparable with RobustBench's: use it as an extra attack, never as AutoAttack's member.

It never looks at a gradient, only at the model's scores, so it is the AutoAttack member that gradient masking
cannot fool. Random search: at iteration i a square window of side ``s = round(√(p_i · d / c))`` (``p_i`` from the
paper's piecewise-constant schedule, rescaled to the query budget, ``p_init = 0.8``) is drawn at a random position;

- ℓ∞: the window's perturbation becomes ``±2ε`` per channel (then clipped to the ε-ball and the box), starting from
  vertical stripes of ``±ε`` (Algorithm 2);
- ℓ2: the window receives the paper's "square" pattern η (nested rectangles of weight 1/(k+1)², two halves of
  opposite sign, eq. 5) of random sign per channel added to its current content, a second random window is emptied,
  and the mass is rescaled so the whole perturbation has norm ε (Algorithm 3), starting from a grid of such patterns.

The candidate replaces the current point iff the margin loss decreases (or it is misclassified). Broken points stop
querying. The window position is drawn once per iteration for the whole batch (as the reference code).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from modelward.errors import ConfigError
from modelward.robustness.attacks import losses
from modelward.robustness.attacks.base import EvasionAttack, Norm, l2_norms

_SCHEDULE = ((10, 1), (50, 2), (200, 4), (500, 8), (1000, 16), (2000, 32), (4000, 64), (6000, 128), (8000, 256))


def p_schedule(i: int, n_queries: int, p_init: float) -> float:
    """The fraction of pixels changed at iteration ``i`` (the paper's schedule for 10,000 queries, rescaled)."""
    it = int(i / n_queries * 10000)
    for bound, div in _SCHEDULE:
        if it <= bound:
            return p_init / div
    return p_init / 512


def _rectangles(h: int, w: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Nested rectangles around the centre, the k-th with weight 1/(k+1)² (eq. 5's M), unit ℓ2 norm."""
    delta = torch.zeros(h, w, device=device, dtype=dtype)
    ch, cw = h // 2, w // 2
    for k in range(max(ch, cw) + 1):
        delta[max(ch - k, 0): min(ch + k + 1, h), max(cw - k, 0): min(cw + k + 1, w)] += 1.0 / (k + 1) ** 2
    return delta / delta.norm().clamp_min(1e-12)


def square_pattern(s: int, device: torch.device, dtype: torch.dtype, flip: bool) -> torch.Tensor:
    """η of Algorithm 3: two opposite-sign halves of nested rectangles, unit norm (transposed when ``flip``)."""
    eta = torch.zeros(s, s, device=device, dtype=dtype)
    eta[: s // 2] = _rectangles(s // 2, s, device, dtype)
    eta[s // 2:] = -_rectangles(s - s // 2, s, device, dtype)
    eta = eta / eta.norm().clamp_min(1e-12)
    return eta.t() if flip else eta


class SquareFull(EvasionAttack):
    """Square Attack with full-image windows (see the module docstring), untargeted, margin loss, ℓ∞ or ℓ2 (inputs of
    shape C×H×W).

    Args:
        model: the classifier under attack (only its scores are used).
        eps: the budget ε.
        norm: ``"linf"`` or ``"l2"``.
        n_queries: the query budget per point (AutoAttack: 5,000).
        p_init: the initial fraction of pixels changed (0.8).
        restarts: independent runs on the points not yet broken (AutoAttack standard: 1).
        clip: the input box.
        seed: seeds every random choice.
        batch_size: attack this many points at a time (default: all).

    Returns:
        ``attack(x, y)`` returns an :class:`~modelward.robustness.attacks.base.AttackResult`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
        >>> x, y = torch.rand(8, 1, 8, 8), torch.randint(10, (8,))
        >>> res = SquareFull(model, eps=0.1, n_queries=50)(x, y)
        >>> bool(((res.x_adv - x).abs() <= 0.1 + 1e-6).all())
        True
    """

    name = "square_full"
    supports_targeted = False
    norms = ("linf", "l2")

    def __init__(self, model: nn.Module, eps: float = 8 / 255, norm: Norm = "linf", n_queries: int = 5000,
                 p_init: float = 0.8, restarts: int = 1, clip: tuple[float, float] = (0.0, 1.0), seed: int = 0,
                 batch_size: int | None = None) -> None:
        if norm not in ("linf", "l2"):
            raise ConfigError(f"{self.name}: norm must be 'linf' or 'l2', got {norm!r}")
        if n_queries < 1 or restarts < 1 or not 0 < p_init <= 1:
            raise ConfigError(f"{self.name}: need n_queries >= 1, restarts >= 1 and 0 < p_init <= 1")
        super().__init__(model, eps, norm, clip, False, seed, batch_size)
        self.n_queries, self.p_init, self.restarts = n_queries, p_init, restarts

    def _signs(self, shape: tuple[int, ...], x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        return torch.randint(0, 2, shape, generator=gen, device=x.device).to(x.dtype).mul_(2).sub_(1)

    def _randint(self, high: int, gen: torch.Generator) -> int:
        """Uniform in 0..high (inclusive), from a block of uniforms drawn ahead (one draw per 4,096 calls)."""
        if not self._uniforms:
            self._uniforms = torch.rand(4096, generator=gen, device=gen.device, dtype=torch.float64).tolist()
        return min(int(self._uniforms.pop() * (high + 1)), high)

    def _init(self, x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        n, c, h, w = x.shape
        eps = self.eps or 0.0
        if self.norm == "linf":  # vertical stripes of ±ε (Algorithm 2's initialisation)
            return (x + eps * self._signs((n, c, 1, w), x, gen)).clamp_(*self.clip)
        s = max(h // 5, 1)  # a grid of η patterns of random sign (Algorithm 3's initialisation)
        delta = torch.zeros_like(x)
        start = (h - s * (h // s)) // 2
        vh = start
        for _ in range(h // s):
            vw = (w - s * (w // s)) // 2
            for _ in range(w // s):
                eta = square_pattern(s, x.device, x.dtype, False)
                delta[:, :, vh: vh + s, vw: vw + s] += eta * self._signs((n, c, 1, 1), x, gen)
                vw += s
            vh += s
        return (x + eps * delta / l2_norms(delta).clamp_min(1e-12)).clamp_(*self.clip)

    def _run(self, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        n, c, h, w = x.shape
        eps, lo, hi = self.eps or 0.0, *self.clip
        self._uniforms: list[float] = []
        best = self._init(x, gen)
        with torch.no_grad():
            logits = self.model(best)
        m_best = losses.margin(logits, y)
        idx = torch.arange(n, device=x.device)
        out, broken = best.clone(), m_best <= 0
        live = ~broken
        idx, xo, yo, xb, mb = idx[live], x[live], y[live], best[live], m_best[live]
        own = torch.nn.functional.one_hot(yo, logits.shape[1]).bool()  # the label's logit, masked out of the runner-up
        if self.norm == "linf":
            low, high = (xo - eps).clamp_(min=lo), (xo + eps).clamp_(max=hi)
        for i in range(1, self.n_queries):
            if len(idx) == 0:
                break
            p = p_schedule(i, self.n_queries, self.p_init)
            if self.norm == "linf":
                s = min(max(int(round(math.sqrt(p * h * w))), 1), h, w)
                vh, vw = self._randint(h - s, gen), self._randint(w - s, gen)
                cand = xb.clone()
                cand[:, :, vh: vh + s, vw: vw + s] += 2 * eps * self._signs((len(idx), c, 1, 1), xo, gen)
                cand = torch.max(torch.min(cand, high), low)
            else:
                cand = self._l2_candidate(xo, xb, p, gen)
            with torch.no_grad():
                z = self.model(cand)
                m = z.gather(1, yo[:, None]).squeeze(1) - z.masked_fill(own, float("-inf")).amax(1)
            better = m < mb
            xb = torch.where(better.view(-1, 1, 1, 1), cand, xb)
            mb = torch.where(better, m, mb)
            fooled = mb <= 0
            if bool(fooled.any()):
                out[idx[fooled]] = xb[fooled]
                broken[idx[fooled]] = True
                keep = ~fooled
                idx, xo, yo, xb, mb, own = idx[keep], xo[keep], yo[keep], xb[keep], mb[keep], own[keep]
                if self.norm == "linf":
                    low, high = low[keep], high[keep]
        out[idx] = xb
        return out, broken

    def _l2_candidate(self, x: torch.Tensor, xb: torch.Tensor, p: float, gen: torch.Generator) -> torch.Tensor:
        """Algorithm 3's update: new η mass in window 1, window 2 emptied, total norm back to ε."""
        n, c, h, w = x.shape
        eps = self.eps or 0.0
        s = max(int(round(math.sqrt(p * h * w))), 3)
        s = min(s + 1 if s % 2 == 0 else s, h, w)
        delta = xb - x
        vh, vw = self._randint(h - s, gen), self._randint(w - s, gen)
        vh2, vw2 = self._randint(h - s, gen), self._randint(w - s, gen)
        win1 = (slice(None), slice(None), slice(vh, vh + s), slice(vw, vw + s))
        mask = torch.zeros(1, 1, h, w, device=x.device, dtype=x.dtype)
        mask[:, :, vh: vh + s, vw: vw + s] = 1
        mask[:, :, vh2: vh2 + s, vw2: vw2 + s] = 1
        norm_win1 = delta[win1].pow(2).sum((-2, -1), keepdim=True).sqrt()
        norm_all = l2_norms(delta)
        norm_windows = l2_norms(delta * mask)
        flip = self._randint(1, gen) == 1
        new = square_pattern(s, x.device, x.dtype, flip).view(1, 1, s, s) * self._signs((n, c, 1, 1), x, gen)
        new = new + delta[win1] / (norm_win1 + 1e-12)
        # the window receives the norm freed by the emptied window plus what is left below ε, split over channels
        budget = ((eps ** 2 - norm_all.pow(2)).clamp_min(0.0) / c + norm_windows.pow(2)).sqrt()
        new = new / new.pow(2).sum((-2, -1), keepdim=True).sqrt().clamp_min(1e-12) * budget
        delta = delta.clone()
        delta[:, :, vh2: vh2 + s, vw2: vw2 + s] = 0.0
        delta[win1] = new
        return (x + eps * delta / l2_norms(delta).clamp_min(1e-12)).clamp_(*self.clip)

    def perturb(self, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None,
                gen: torch.Generator) -> torch.Tensor:
        if x.dim() != 4:
            raise ConfigError(f"{self.name}: inputs must be images N×C×H×W, got shape {tuple(x.shape)}")
        out = x.clone()
        with torch.no_grad():
            todo = self.model(x).argmax(1) == y
        for _ in range(self.restarts):
            rows = todo.nonzero().squeeze(1)
            if len(rows) == 0:
                break
            adv, broken = self._run(x[rows], y[rows], gen)
            out[rows] = adv
            todo[rows[broken]] = False
        return out
