"""Square Attack (Andriushchenko, Croce, Flammarion, Hein, ECCV 2020) as AutoAttack runs it: a score-based black-box
attack, ℓ∞ (Algorithms 1–2) and ℓ2 (Algorithm 3), on the margin loss ``z_y − max_{i≠y} z_i``.

It never looks at a gradient, only at the model's scores, so it is the AutoAttack member that gradient masking
cannot fool. This class follows the reference implementation (``autoattack/square.py`` of fra31/auto-attack, the
code RobustBench runs; torchattacks' ``Square`` is a copy of it) step by step, so that a robust accuracy called
AutoAttack is comparable with RobustBench's (issue 38 item 3):

- random numbers come from a CPU generator seeded with ``seed`` at the start of every ``perturb`` call, drawn in the
  reference's order and shapes (``torch.rand`` for the window corners, ``sign(2·rand − 1)`` for the signs, one
  ``rand`` per η for its orientation), so on the same inputs it takes the same steps as the reference, point for
  point;
- iteration ``i = 0 … n_queries − 1`` uses ``p = p_init / 2^k`` from the paper's schedule for 10,000 queries,
  rescaled; the window side is ``s = round(√(p·h·w))`` (ℓ2: at least 3 and odd), capped at the image size;
- a window's corner is drawn in ``0 … h − s − 1`` (the reference's ``random_int``: the window never reaches the last
  row and column unless it covers the whole image), and one sign per channel is shared by the batch;
- ℓ∞: the window becomes ``±2ε`` (then clipped to the ε-ball and the box), from vertical stripes of ``±ε``;
- ℓ2: the window receives the η pattern (nested rectangles of weight 1/(k+1)², two halves of opposite sign) plus its
  current content, a second window is emptied, and the mass freed (per channel, as the reference since March 2021;
  torchattacks 3.5 still measures it over the whole image, the same for one channel) is put back so the whole
  perturbation has norm ε, from a grid of η patterns;
- a candidate replaces the current point iff its margin is lower, or it is misclassified.

Where the reference cannot run at all it is extended and says so: inputs that are not images (N×d rows) are
attacked as 1×1×d images, and an ℓ2 initialisation on images smaller than 5 pixels a side (the reference's grid
``h // 5`` is then empty and divides by zero) uses 1-pixel cells from the corner. The stronger variant that lets
windows reach every pixel is :class:`modelward.robustness.attacks.square_full.SquareFull` (``square_full``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from modelward.errors import ConfigError
from modelward.robustness.attacks.base import EvasionAttack, Norm


def p_selection(it: int, n_queries: int, p_init: float) -> float:
    """The fraction of pixels a window covers at iteration ``it`` (0-based): the paper's schedule for 10,000 queries,
    rescaled to ``n_queries`` (the reference's ``p_selection`` with ``resc_schedule=True``)."""
    it = int(it / n_queries * 10000)
    for bound, div in ((10, 1), (50, 2), (200, 4), (500, 8), (1000, 16), (2000, 32), (4000, 64), (6000, 128),
                       (8000, 256)):
        if it <= bound:
            return p_init / div
    return p_init / 512


class _Flat(nn.Module):
    """An N×d model seen as one taking 1×1×d images (Square's windows then move along the features)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.flatten(1))


class Square(EvasionAttack):
    """Square Attack (Andriushchenko et al. 2020) as in AutoAttack's reference code: untargeted, margin loss, ℓ∞ or
    ℓ2, on images N×C×H×W (N×d rows are attacked as 1×1×d images).

    Args:
        model: the classifier under attack (only its scores are used).
        eps: the budget ε.
        norm: ``"linf"`` or ``"l2"``.
        n_queries: iterations per restart, one query each after the first (AutoAttack standard: 5,000).
        p_init: the initial fraction of pixels a window covers (0.8).
        restarts: runs on the points not yet broken (AutoAttack standard: 1).
        clip: the input box (the reference: [0, 1]).
        seed: seeds the reference's random stream at every call.
        batch_size: attack this many points at a time (default: all; the reference runs per batch too).

    Returns:
        ``attack(x, y)`` returns an :class:`~modelward.robustness.attacks.base.AttackResult`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
        >>> x, y = torch.rand(8, 1, 8, 8), torch.randint(10, (8,))
        >>> res = Square(model, eps=0.1, n_queries=50)(x, y)
        >>> bool(((res.x_adv - x).abs() <= 0.1 + 1e-6).all())
        True
    """

    name = "square"
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

    # -- the reference's random stream (CPU, global-generator semantics on a private generator) ------------------
    def _rand(self, shape: list[int]) -> torch.Tensor:
        return torch.rand(shape, generator=self._g).to(self._dev)

    def _choice(self, shape: list[int]) -> torch.Tensor:
        return torch.sign(2 * self._rand(shape) - 1)

    def _int(self, low: int, high: int) -> int:
        return int((low + (high - low) * torch.rand([1], generator=self._g)).long())

    def _rectangles(self, x: int, y: int) -> torch.Tensor:
        delta = torch.zeros([x, y], device=self._dev)
        x_c, y_c = x // 2 + 1, y // 2 + 1
        c2 = [x_c - 1, y_c - 1]
        for k in range(max(x_c, y_c)):
            delta[max(c2[0], 0): min(c2[0] + (2 * k + 1), x), max(0, c2[1]): min(c2[1] + (2 * k + 1), y)] += (
                1.0 / (torch.tensor([float(k + 1)], device=self._dev).view(1, 1) ** 2))
            c2[0] -= 1
            c2[1] -= 1
        return delta / (delta ** 2).sum(dim=(0, 1), keepdim=True).sqrt()

    def _eta(self, s: int) -> torch.Tensor:
        delta = torch.zeros([s, s], device=self._dev)
        delta[: s // 2] = self._rectangles(s // 2, s)
        delta[s // 2:] = -1.0 * self._rectangles(s - s // 2, s)
        delta = delta / (delta ** 2).sum(dim=(0, 1), keepdim=True).sqrt()
        if bool(torch.rand([1], generator=self._g) > 0.5):
            delta = delta.permute([1, 0])
        return delta

    # -- the attack -------------------------------------------------------------------------------------------
    def _margin(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.model(x).clone()
        u = torch.arange(x.shape[0], device=x.device)
        y_corr = logits[u, y].clone()
        logits[u, y] = -float("inf")
        return y_corr - logits.max(dim=-1)[0]

    def _normalize(self, d: torch.Tensor) -> torch.Tensor:
        t = (d ** 2).view(d.shape[0], -1).sum(-1).sqrt()
        return d / (t.view(-1, 1, 1, 1) + 1e-12)

    def _single_run(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One run of the reference's ``attack_single_run`` (margin loss: the loss and the margin coincide)."""
        c, h, w = x.shape[1:]
        eps, (lo, hi) = self.eps or 0.0, self.clip
        if self.norm == "linf":
            x_best = torch.clamp(x + eps * self._choice([x.shape[0], c, 1, w]), lo, hi)
        else:
            delta_init = torch.zeros_like(x)
            s = h // 5 if h >= 5 else 1  # below 5 pixels the reference's grid is empty (and divides by 0)
            sp_init = (h - s * 5) // 2 if h >= 5 else 0
            vh = sp_init
            for _ in range(h // s):
                vw = sp_init
                for _ in range(w // s):
                    delta_init[:, :, vh: vh + s, vw: vw + s] += (self._eta(s).view(1, 1, s, s)
                                                                 * self._choice([x.shape[0], c, 1, 1]))
                    vw += s
                vh += s
            x_best = torch.clamp(x + self._normalize(delta_init) * eps, lo, hi)
        margin_min = self._margin(x_best, y)
        loss_min = margin_min.clone()
        if bool((margin_min < 0.0).all()):
            return x_best
        n_features = c * h * w
        for i_iter in range(self.n_queries):
            idx = (margin_min > 0.0).nonzero().flatten()
            if len(idx) == 0:
                break
            x_curr, x_best_curr, y_curr = x[idx], x_best[idx], y[idx]
            margin_min_curr, loss_min_curr = margin_min[idx], loss_min[idx]
            p = p_selection(i_iter, self.n_queries, self.p_init)
            if self.norm == "linf":
                s = max(int(round(math.sqrt(p * n_features / c))), 1)
                s = min(s, min(h, w))
                vh, vw = self._int(0, h - s), self._int(0, w - s)
                new_deltas = torch.zeros([c, h, w], device=x.device, dtype=x.dtype)
                new_deltas[:, vh: vh + s, vw: vw + s] = 2.0 * eps * self._choice([c, 1, 1])
                x_new = x_best_curr + new_deltas
                x_new = torch.min(torch.max(x_new, x_curr - eps), x_curr + eps)
                x_new = torch.clamp(x_new, lo, hi)
            else:
                x_new = self._l2_candidate(x_curr, x_best_curr, p, n_features)
            margin = self._margin(x_new, y_curr)
            loss = margin
            improved = (loss < loss_min_curr).float()
            loss_min[idx] = improved * loss + (1.0 - improved) * loss_min_curr
            improved = torch.max(improved, (margin <= 0.0).float())
            margin_min[idx] = improved * margin + (1.0 - improved) * margin_min_curr
            improved = improved.reshape([-1, 1, 1, 1])
            x_best[idx] = improved * x_new + (1.0 - improved) * x_best_curr
            if bool((margin_min <= 0.0).all()):
                break
        return x_best

    def _l2_candidate(self, x_curr: torch.Tensor, x_best_curr: torch.Tensor, p: float, n_features: int
                      ) -> torch.Tensor:
        """Algorithm 3's update, in the reference's operations: η plus the window's content in window 1, window 2
        emptied, the freed mass (per channel) and what is left below ε put back, the whole rescaled to norm ε."""
        c, h, w = x_curr.shape[1:]
        eps, (lo, hi) = self.eps or 0.0, self.clip
        delta_curr = x_best_curr - x_curr
        s = max(int(round(math.sqrt(p * n_features / c))), 3)
        if s % 2 == 0:
            s += 1
        s = min(s, min(h, w))
        vh, vw = self._int(0, h - s), self._int(0, w - s)
        mask1 = torch.zeros_like(x_curr)
        mask1[:, :, vh: vh + s, vw: vw + s] = 1.0
        norms_window_1 = (delta_curr[:, :, vh: vh + s, vw: vw + s] ** 2).sum(dim=(-2, -1), keepdim=True).sqrt()
        vh2, vw2 = self._int(0, h - s), self._int(0, w - s)
        mask2 = torch.zeros_like(x_curr)
        mask2[:, :, vh2: vh2 + s, vw2: vw2 + s] = 1.0
        norms_image = (delta_curr ** 2).view(delta_curr.shape[0], -1).sum(-1).sqrt().view(-1, 1, 1, 1)
        mask_image = torch.max(mask1, mask2)
        norms_windows = ((delta_curr * mask_image) ** 2).sum(dim=(-2, -1), keepdim=True).sqrt()
        new_deltas = torch.ones([x_curr.shape[0], c, s, s], device=x_curr.device, dtype=x_curr.dtype)
        new_deltas *= self._eta(s).view(1, 1, s, s) * self._choice([x_curr.shape[0], c, 1, 1])
        old_deltas = delta_curr[:, :, vh: vh + s, vw: vw + s] / (1e-12 + norms_window_1)
        new_deltas += old_deltas
        new_deltas = new_deltas / (1e-12 + (new_deltas ** 2).sum(dim=(-2, -1), keepdim=True).sqrt()) * (
            torch.max((eps * torch.ones_like(new_deltas)) ** 2 - norms_image ** 2, torch.zeros_like(new_deltas)) / c
            + norms_windows ** 2).sqrt()
        delta_curr[:, :, vh2: vh2 + s, vw2: vw2 + s] = 0.0
        delta_curr[:, :, vh: vh + s, vw: vw + s] = new_deltas + 0
        return torch.clamp(x_curr + self._normalize(delta_curr) * eps, lo, hi)

    def perturb(self, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None,
                gen: torch.Generator) -> torch.Tensor:
        if x.dim() == 2:  # tabular rows: 1×1×d images of a model that flattens them back
            model, self.model = self.model, _Flat(self.model)
            try:
                return self.perturb(x.view(len(x), 1, 1, -1), y, target, gen).view_as(x)
            finally:
                self.model = model
        if x.dim() != 4:
            raise ConfigError(f"{self.name}: inputs must be images N×C×H×W or rows N×d, got shape {tuple(x.shape)}")
        self._dev = x.device
        self._g = torch.Generator().manual_seed(self.seed)  # the reference reseeds at every perturb call
        adv = x.clone()
        with torch.no_grad():
            acc = self.model(x).max(1)[1] == y
            for _ in range(self.restarts):
                todo = acc.nonzero().flatten()
                if len(todo) == 0:
                    break
                adv_curr = self._single_run(x[todo].clone(), y[todo].clone())
                fooled = (self.model(adv_curr).max(1)[1] != y[todo]).nonzero().flatten()
                acc[todo[fooled]] = False
                adv[todo[fooled]] = adv_curr[fooled].clone()
        return adv
