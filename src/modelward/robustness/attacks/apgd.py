"""Auto-PGD (Croce & Hein, ICML 2020, "Reliable evaluation of adversarial robustness with an ensemble of diverse
parameter-free attacks", Algorithm 1), ℓ∞ and ℓ2, with the cross-entropy or DLR objective.

Algorithm 1, per point:

- start ``x⁽⁰⁾`` at a random point of the ε-sphere (ℓ∞: a random sign pattern scaled so ``‖δ‖∞ = ε``; ℓ2: a Gaussian
  direction of norm ε), step size ``η⁽⁰⁾ = 2ε``, ``x⁽¹⁾ = P_S(x⁽⁰⁾ + η ∇f(x⁽⁰⁾))``;
- ``z⁽ᵏ⁺¹⁾ = P_S(x⁽ᵏ⁾ + η⁽ᵏ⁾ ∇f(x⁽ᵏ⁾))`` (sign step for ℓ∞, normalised gradient for ℓ2),
  ``x⁽ᵏ⁺¹⁾ = P_S(x⁽ᵏ⁾ + α(z⁽ᵏ⁺¹⁾ − x⁽ᵏ⁾) + (1 − α)(x⁽ᵏ⁾ − x⁽ᵏ⁻¹⁾))`` with momentum α = 0.75;
- at the checkpoints ``w_j = ⌈p_j N_iter⌉``, ``p_0 = 0, p_1 = 0.22, p_{j+1} = p_j + max(p_j − p_{j−1} − 0.03, 0.06)``,
  the step size is halved and the iterate restarts from the best point so far when
  (condition 1) the objective increased in fewer than ``ρ · (w_j − w_{j−1})`` of the steps since the last
  checkpoint (ρ = 0.75), or (condition 2) the step size was not reduced at the last checkpoint and the best objective
  has not improved since.

``S`` is the ε-ball of the norm intersected with the input box. A point counts as broken as soon as any iterate is
misclassified (the iterate is kept); broken points leave the batch (their result cannot change), the others return
the iterate with the highest objective.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from modelward.errors import ConfigError
from modelward.robustness.attacks import losses
from modelward.robustness.attacks.base import EvasionAttack, Norm, l2_norms, project_l2

#: objective(logits, y, target) -> one value per row, to maximise
Objective = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


def checkpoints(steps: int) -> list[int]:
    """The iterations ``w_j = ⌈p_j N⌉`` (j ≥ 1) at which APGD may halve its step (Croce & Hein 2020, §3.1)."""
    p = [0.0, 0.22]
    while p[-1] < 1.0:
        p.append(p[-1] + max(p[-1] - p[-2] - 0.03, 0.06))
    # round before the ceiling: 0.22 · 100 is 22.000000000000004 in floating point
    marks = sorted({math.ceil(round(q * steps, 9)) for q in p[1:]})
    return [w for w in marks if 0 < w <= steps]


def _random_start(x: torch.Tensor, eps: float, norm: str, clip: tuple[float, float],
                  gen: torch.Generator) -> torch.Tensor:
    if norm == "linf":
        t = torch.rand(x.shape, generator=gen, device=x.device, dtype=x.dtype).mul_(2).sub_(1)
        t = t / t.flatten(1).abs().amax(1).clamp_min(1e-12).view(-1, *([1] * (x.dim() - 1)))
    else:
        t = torch.randn(x.shape, generator=gen, device=x.device, dtype=x.dtype)
        t = t / l2_norms(t).clamp_min(1e-12)
    return (x + eps * t).clamp_(*clip)


def apgd_search(model: nn.Module, x: torch.Tensor, y: torch.Tensor, objective: Objective, eps: float, norm: str,
                steps: int, clip: tuple[float, float], gen: torch.Generator, target: torch.Tensor | None = None,
                rho: float = 0.75, momentum: float = 0.75, eot_iter: int = 1,
                group: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One run of Algorithm 1 on a batch; returns ``(x_adv, broken)`` (broken: some iterate was misclassified).

    Args:
        model: the classifier (already in eval mode, parameters frozen).
        x, y: the points and their labels.
        objective: ``(logits, y, target) -> per-row value`` to maximise (CE, DLR, targeted DLR).
        eps, norm: the ball (``"linf"`` or ``"l2"``).
        steps: N_iter.
        clip: the input box.
        gen: the random generator (the start point).
        target: per-row target class for a targeted objective.
        rho: condition 1's fraction of increasing steps.
        momentum: α of the momentum update.
        eot_iter: forward/backward draws averaged per step (expectation over transformation, for random
            forward passes; 1 = deterministic model).
        group: optional point id per row (several rows attacking one point, e.g. one per target class): once a
            row of a group breaks its point, the group's other rows stop (their results are not needed).

    Returns:
        ``(x_adv, broken)``.
    """
    out = x.clone()
    broken = torch.zeros(len(x), dtype=torch.bool, device=x.device)
    idx = torch.arange(len(x), device=x.device)  # rows of the batch still being attacked
    grp = group if group is not None else idx
    group_done = torch.zeros(int(grp.max()) + 1 if len(grp) else 0, dtype=torch.bool, device=x.device)
    xo, yo, to = x, y, target
    if norm == "linf":
        low, high = (x - eps).clamp_(min=clip[0]), (x + eps).clamp_(max=clip[1])

    def project(z: torch.Tensor) -> torch.Tensor:
        if norm == "linf":
            return torch.max(torch.min(z, high), low)
        return project_l2(z, xo, eps, clip)

    def evaluate(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        z = z.detach().requires_grad_(True)
        value_sum, g_sum = None, None
        for _ in range(eot_iter):  # expectation over the forward pass's randomness (EOT) when eot_iter > 1
            with torch.enable_grad():
                logits = model(z)
                value = objective(logits, yo, to)
                (g,) = torch.autograd.grad(value.sum(), z)
            value_sum = value.detach() if value_sum is None else value_sum + value.detach()
            g_sum = g if g_sum is None else g_sum + g
        assert value_sum is not None and g_sum is not None
        return value_sum / eot_iter, logits.detach().argmax(1) != yo, g_sum / eot_iter

    def ascent(g: torch.Tensor) -> torch.Tensor:
        return g.sign() if norm == "linf" else g / l2_norms(g).clamp_min(1e-12)

    x_adv = _random_start(x, eps, norm, clip, gen)
    value, wrong, grad = evaluate(x_adv)
    step = torch.full((len(x), *([1] * (x.dim() - 1))), 2.0 * eps, device=x.device, dtype=x.dtype)
    x_best, g_best, v_best = x_adv.clone(), grad.clone(), value.clone()
    x_prev = x_adv.clone()
    v_prev = value.clone()
    n_incr = torch.zeros(len(x), device=x.device)
    v_best_check = v_best.clone()
    reduced_check = torch.zeros(len(x), dtype=torch.bool, device=x.device)
    marks = checkpoints(steps)
    last_mark, mark_i = 0, 0

    def retire(mask: torch.Tensor, cand: torch.Tensor) -> None:
        """Store the broken rows' adversarial iterates and drop them from every state tensor."""
        nonlocal idx, xo, yo, to, x_adv, x_prev, grad, step, x_best, g_best, v_best, v_prev, n_incr
        nonlocal v_best_check, reduced_check, low, high, grp
        out[idx[mask]] = cand[mask]
        broken[idx[mask]] = True
        group_done[grp[mask]] = True
        keep = ~group_done[grp]
        idx, xo, yo, grp = idx[keep], xo[keep], yo[keep], grp[keep]
        to = to[keep] if to is not None else None
        x_adv, x_prev, grad, step = x_adv[keep], x_prev[keep], grad[keep], step[keep]
        x_best, g_best, v_best, v_prev = x_best[keep], g_best[keep], v_best[keep], v_prev[keep]
        n_incr, v_best_check, reduced_check = n_incr[keep], v_best_check[keep], reduced_check[keep]
        if norm == "linf":
            low, high = low[keep], high[keep]

    if norm != "linf":
        low = high = x  # unused placeholders so ``retire`` can treat both norms alike
    if bool(wrong.any()):
        retire(wrong, x_adv)
    for k in range(steps):
        if len(idx) == 0:
            break
        with torch.no_grad():
            z = project(x_adv + step * ascent(grad))
            a = momentum if k > 0 else 1.0
            x_new = project(x_adv + a * (z - x_adv) + (1 - a) * (x_adv - x_prev)) if k > 0 else z
        x_prev, x_adv = x_adv, x_new
        value, wrong, grad = evaluate(x_adv)
        n_incr += (value > v_prev).float()
        v_prev = value
        better = value > v_best
        x_best[better], g_best[better], v_best[better] = x_adv[better], grad[better], value[better]
        if bool(wrong.any()):
            retire(wrong, x_adv)
            if len(idx) == 0:
                break
        if mark_i < len(marks) and k + 1 == marks[mark_i]:
            span = marks[mark_i] - last_mark
            cond1 = n_incr < rho * span
            cond2 = ~reduced_check & (v_best_check >= v_best)
            reduce = cond1 | cond2
            step[reduce] /= 2.0
            x_adv[reduce], grad[reduce] = x_best[reduce], g_best[reduce]
            reduced_check, v_best_check = reduce, v_best.clone()
            n_incr.zero_()
            last_mark, mark_i = marks[mark_i], mark_i + 1
    out[idx] = x_best
    return out, broken


class APGD(EvasionAttack):
    """Auto-PGD (Croce & Hein 2020, Algorithm 1), untargeted, with the cross-entropy (APGD-CE) or DLR objective.

    Step size 2ε halved at the checkpoints of Algorithm 1, momentum 0.75, random start on the ε-sphere; restarts run
    only on the points not yet broken. No step size to tune: that is the point of the attack.

    Args:
        model: the classifier under attack (returns logits).
        eps: the budget ε.
        norm: ``"linf"`` or ``"l2"``.
        steps: iterations N_iter per restart (AutoAttack: 100).
        restarts: random restarts (AutoAttack standard: 1).
        loss: ``"ce"`` (APGD-CE) or ``"dlr"`` (APGD-DLR).
        rho: condition 1's fraction (0.75).
        eot_iter: gradient draws averaged per step (EOT, for a random forward pass; default 1).
        clip: the input box; adversarial inputs never leave it.
        seed: seeds every random choice.
        batch_size: attack this many points at a time (default: all).

    Returns:
        ``attack(x, y)`` returns an :class:`~modelward.robustness.attacks.base.AttackResult`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
        >>> x, y = torch.rand(8, 1, 8, 8), torch.randint(10, (8,))
        >>> res = APGD(model, eps=0.1, steps=10)(x, y)
        >>> bool(((res.x_adv - x).abs() <= 0.1 + 1e-6).all())
        True
    """

    name = "apgd"
    supports_targeted = False
    norms = ("linf", "l2")

    def __init__(self, model: nn.Module, eps: float = 8 / 255, norm: Norm = "linf", steps: int = 100,
                 restarts: int = 1, loss: str = "ce", rho: float = 0.75, clip: tuple[float, float] = (0.0, 1.0),
                 seed: int = 0, batch_size: int | None = None, eot_iter: int = 1) -> None:
        if norm not in ("linf", "l2"):
            raise ConfigError(f"{self.name}: norm must be 'linf' or 'l2', got {norm!r}")
        if loss not in ("ce", "dlr"):
            raise ConfigError(f"{self.name}: loss must be 'ce' or 'dlr', got {loss!r}")
        if steps < 1 or restarts < 1:
            raise ConfigError(f"{self.name}: steps and restarts must be >= 1, got {steps}, {restarts}")
        if not 0 < rho <= 1 or eot_iter < 1:
            raise ConfigError(f"{self.name}: need 0 < rho <= 1 and eot_iter >= 1, got rho={rho}, eot_iter={eot_iter}")
        super().__init__(model, eps, norm, clip, False, seed, batch_size)
        self.steps, self.restarts, self.loss, self.rho, self.eot_iter = steps, restarts, loss, rho, eot_iter

    def _objective(self) -> Objective:
        fn = losses.cross_entropy if self.loss == "ce" else losses.dlr
        return lambda z, y, t: fn(z, y)

    def perturb(self, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None,
                gen: torch.Generator) -> torch.Tensor:
        out = x.clone()
        with torch.no_grad():  # as the reference: only the points classified correctly are attacked
            todo = self.model(x).argmax(1) == y
        for _ in range(self.restarts):
            rows = todo.nonzero().squeeze(1)
            if len(rows) == 0:
                break
            adv, broken = apgd_search(self.model, x[rows], y[rows], self._objective(), self.eps or 0.0,
                                      self.norm, self.steps, self.clip, gen, rho=self.rho, eot_iter=self.eot_iter)
            out[rows] = adv
            todo[rows[broken]] = False
        return out
