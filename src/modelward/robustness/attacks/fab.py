"""FAB-T: the targeted Fast Adaptive Boundary attack (Croce & Hein, ICML 2020, "Minimally distorted adversarial
examples with a fast adaptive boundary attack", Algorithm 1; the targeted version of AutoAttack, §4).

For a target class ``t`` and the label ``y``, each iteration linearises ``g = f_t − f_y`` at the iterate
``x⁽ⁱ⁾`` and projects onto the approximate decision hyperplane ``π = {z : g(x⁽ⁱ⁾) + ∇g·(z − x⁽ⁱ⁾) = 0}`` both the
iterate and the original point, each with the minimal ℓp step inside the input box (``proj_p``, eq. 6 — solved
exactly here by sorting the break-points of the one-dimensional dual):

    δ⁽ⁱ⁾ = proj_p(x⁽ⁱ⁾, π, C) − x⁽ⁱ⁾,   δ_orig = proj_p(x_orig, π, C) − x_orig,
    α = min(‖δ⁽ⁱ⁾‖ / (‖δ⁽ⁱ⁾‖ + ‖δ_orig‖), α_max),
    x⁽ⁱ⁺¹⁾ = P_C((1 − α)(x⁽ⁱ⁾ + η δ⁽ⁱ⁾) + α(x_orig + η δ_orig)),

and when ``x⁽ⁱ⁺¹⁾`` is misclassified it is kept if it is the closest found so far and pulled back towards the
original point, ``x⁽ⁱ⁺¹⁾ ← (1 − β) x_orig + β x⁽ⁱ⁺¹⁾`` (the "backward step"). FAB minimises the perturbation; as an
ε-attack, a point counts as broken once an adversarial example within ε is found (it then leaves the batch).
The targets are the ``n_target_classes`` highest other clean logits (AutoAttack standard: 9); they run side by
side (one row per point and target, independent iterations), and a point's rows stop once one breaks it.
"""

from __future__ import annotations

import torch
from torch import nn

from modelward.errors import ConfigError
from modelward.robustness.attacks import losses
from modelward.robustness.attacks.base import EvasionAttack, Norm


def min_norm_to_hyperplane(p: torch.Tensor, w: torch.Tensor, b: torch.Tensor, lo: float, hi: float,
                           norm: str) -> torch.Tensor:
    """Per row, the δ of least ℓ∞ or ℓ2 norm with ``w·(p + δ) = b`` and ``lo ≤ p + δ ≤ hi`` (FAB's ``proj_p``).

    With ``c = b − w·p`` (the sign folded into ``w``), the optimum puts ``|δ_i| = min(τ r_i, m_i)`` on the sign of
    ``w_i`` — ``r_i = 1`` for ℓ∞, ``r_i = |w_i|`` for ℓ2 (KKT), ``m_i`` the room left in the box — where ``τ`` solves the
    piecewise-linear ``Σ |w_i| min(τ r_i, m_i) = |c|``: sort the break-points ``m_i / r_i`` and locate ``τ`` by
    cumulative sums. If the box cannot reach the hyperplane, every coordinate goes to its box limit.

    Args:
        p: points, n × d.
        w, b: the hyperplanes ``w·z = b`` (n × d, n).
        lo, hi: the box.
        norm: ``"linf"`` or ``"l2"``.

    Returns:
        δ (n × d).
    """
    c = b - (w * p).sum(1)
    sgn = torch.sign(c)
    ws = w * sgn[:, None]
    a = ws.abs()
    room = torch.where(ws > 0, hi - p, p - lo).clamp_min(0.0)
    rate = torch.ones_like(a) if norm == "linf" else a
    live = a > 0
    brk = torch.where(live & (rate > 0), room / rate.clamp_min(1e-30), torch.full_like(a, float("inf")))
    order = brk.argsort(1)
    brk_s = brk.gather(1, order)
    sat_s = (a * room).gather(1, order)  # contribution of a saturated coordinate
    slope_s = (a * rate).gather(1, order)  # contribution per unit τ of a free coordinate
    sat_cum = sat_s.cumsum(1)
    slope_total = slope_s.sum(1, keepdim=True)
    slope_after = slope_total - slope_s.cumsum(1)  # Σ over coordinates after break-point k
    finite = torch.isfinite(brk_s)
    f_at = torch.where(finite, sat_cum + brk_s.nan_to_num(posinf=0.0) * slope_after, torch.full_like(sat_cum,
                                                                                                  float("inf")))
    need = c.abs()[:, None]
    k = (f_at < need).sum(1, keepdim=True)  # break-points passed before reaching |c|
    d = p.shape[1]
    kk = (k - 1).clamp_min(0)
    sat_prev = torch.where(k > 0, sat_cum.gather(1, kk), torch.zeros_like(need))
    slope_prev = torch.where(k > 0, slope_after.gather(1, kk), slope_total)
    tau = ((need - sat_prev) / slope_prev.clamp_min(1e-30)).clamp_min(0.0)
    tau = torch.where(k >= d, torch.full_like(tau, float("inf")), tau)
    mag = torch.minimum(tau * rate, room)
    mag = torch.where(live, mag, torch.zeros_like(mag))
    return torch.sign(ws) * mag * (c != 0).to(p.dtype)[:, None]


def _norm(t: torch.Tensor, norm: str) -> torch.Tensor:
    return t.abs().amax(1) if norm == "linf" else t.norm(dim=1)


class FAB(EvasionAttack):
    """Targeted FAB (FAB-T; Croce & Hein 2020, Algorithm 1 with a fixed target class per run), ℓ∞ and ℓ2.

    Args:
        model: the classifier under attack (returns logits).
        eps: the budget ε (a point is broken when an adversarial example within ε is found).
        norm: ``"linf"`` or ``"l2"``.
        steps: iterations per target class (AutoAttack: 100).
        n_target_classes: highest other clean classes to target in turn (AutoAttack standard: 9).
        alpha_max: the cap of the bias towards the original point (0.1).
        eta: the overshoot of the projection step (1.05).
        beta: the backward step's factor (0.9).
        clip: the input box.
        seed: seeds every random choice (FAB-T's first run starts at x, so it draws none).
        batch_size: attack this many points at a time (default: all).

    Returns:
        ``attack(x, y)`` returns an :class:`~modelward.robustness.attacks.base.AttackResult` (success =
        misclassified within ε).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
        >>> x, y = torch.rand(8, 1, 8, 8), torch.randint(10, (8,))
        >>> res = FAB(model, eps=1.0, norm="l2", steps=10, n_target_classes=2)(x, y)
        >>> bool(((res.x_adv - x).flatten(1).norm(dim=1) <= 1.0 + 1e-5).all())
        True
    """

    name = "fab"
    supports_targeted = False  # the targets are chosen internally; success means misclassification
    norms = ("linf", "l2")

    def __init__(self, model: nn.Module, eps: float = 8 / 255, norm: Norm = "linf", steps: int = 100,
                 n_target_classes: int = 9, alpha_max: float = 0.1, eta: float = 1.05, beta: float = 0.9,
                 clip: tuple[float, float] = (0.0, 1.0), seed: int = 0, batch_size: int | None = None) -> None:
        if norm not in ("linf", "l2"):
            raise ConfigError(f"{self.name}: norm must be 'linf' or 'l2', got {norm!r}")
        if steps < 1 or n_target_classes < 1:
            raise ConfigError(f"{self.name}: steps and n_target_classes must be >= 1")
        if not (0 <= alpha_max <= 1 and eta >= 1 and 0 < beta < 1):
            raise ConfigError(f"{self.name}: need 0 <= alpha_max <= 1, eta >= 1, 0 < beta < 1")
        super().__init__(model, eps, norm, clip, False, seed, batch_size)
        self.steps, self.n_target_classes = steps, n_target_classes
        self.alpha_max, self.eta, self.beta = alpha_max, eta, beta

    def _linearise(self, z: torch.Tensor, y: torch.Tensor, t: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logits at z, g = f_t − f_y and ∇g (flattened)."""
        z = z.detach().requires_grad_(True)
        with torch.enable_grad():
            logits = self.model(z)
            g = logits.gather(1, t[:, None]).squeeze(1) - logits.gather(1, y[:, None]).squeeze(1)
            (grad,) = torch.autograd.grad(g.sum(), z)
        return logits.detach(), g.detach(), grad.flatten(1)

    def _run(self, x0: torch.Tensor, y: torch.Tensor, t: torch.Tensor,
             group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """FAB-T on rows towards targets ``t``: (adversarial within ε or x0, broken mask). ``group`` is the point
        of each row: once a row breaks its point within ε, the point's other rows stop."""
        eps, lo, hi = self.eps or 0.0, *self.clip
        shape = x0.shape
        x0f = x0.flatten(1)
        out = x0f.clone()
        broken = torch.zeros(len(x0), dtype=torch.bool, device=x0.device)
        idx = torch.arange(len(x0), device=x0.device)
        grp = group
        group_done = torch.zeros(int(group.max()) + 1, dtype=torch.bool, device=x0.device)
        xo, yo, to = x0f, y, t
        x1 = x0f.clone()
        _, g, w = self._linearise(x1.view(-1, *shape[1:]), yo, to)
        for _ in range(self.steps):
            b = (w * x1).sum(1) - g  # the linearised boundary w·z = b
            # both projections in one call (iterate and original point onto the same hyperplane)
            d12 = min_norm_to_hyperplane(torch.cat((x1, xo)), torch.cat((w, w)), torch.cat((b, b)), lo, hi,
                                         self.norm)
            d1, d2 = d12[: len(x1)], d12[len(x1):]
            n1, n2 = _norm(d1, self.norm), _norm(d2, self.norm)
            alpha = (n1 / (n1 + n2).clamp_min(1e-12)).clamp(0.0, self.alpha_max)[:, None]
            x1 = ((1 - alpha) * (x1 + self.eta * d1) + alpha * (xo + self.eta * d2)).clamp_(lo, hi)
            logits, g, w = self._linearise(x1.view(-1, *shape[1:]), yo, to)
            adv = logits.argmax(1) != yo
            if bool(adv.any()):
                within = adv & (_norm(x1 - xo, self.norm) <= eps)
                if bool(within.any()):  # broken within ε: keep the example, drop the row
                    out[idx[within]] = x1[within]
                    broken[idx[within]] = True
                    group_done[grp[within]] = True
                    keep = ~group_done[grp]
                    idx, xo, yo, to, x1, adv = idx[keep], xo[keep], yo[keep], to[keep], x1[keep], adv[keep]
                    grp = grp[keep]
                    g, w = g[keep], w[keep]
                    if len(idx) == 0:
                        break
                if bool(adv.any()):  # backward step towards the original point, re-linearised there
                    x1[adv] = (1 - self.beta) * xo[adv] + self.beta * x1[adv]
                    _, g_b, w_b = self._linearise(x1[adv].view(-1, *shape[1:]), yo[adv], to[adv])
                    g[adv], w[adv] = g_b, w_b
        return out.view(shape), broken

    def perturb(self, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None,
                gen: torch.Generator) -> torch.Tensor:
        out = x.clone()
        with torch.no_grad():
            logits = self.model(x)
        todo = logits.argmax(1) == y
        k = min(self.n_target_classes, logits.shape[1] - 1)
        targets = losses.top_other_classes(logits, y, k)
        rows = todo.nonzero().squeeze(1)
        if len(rows) == 0:
            return out
        # all targets side by side, one row per (point, target); a point's rows stop once one breaks it
        xr = x[rows].repeat(k, *([1] * (x.dim() - 1)))
        group = torch.arange(len(rows), device=x.device).repeat(k)
        adv, broken = self._run(xr, y[rows].repeat(k), targets[rows].t().flatten(), group)
        hit = broken.view(k, len(rows))
        pick = hit.float().argmax(0) * len(rows) + torch.arange(len(rows), device=x.device)
        done = hit.any(0)
        out[rows[done]] = adv[pick][done]
        return out
