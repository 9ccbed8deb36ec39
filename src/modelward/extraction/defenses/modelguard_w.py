"""ModelGuard-W (ModelGuard paper, Sec. 3.3, Eq. 9; the official code's ``MLD``).

Per query, with t = argmax y and c_k = log(y_k + 1e-6):

    minimise   Σ_k c_k ŷ_k
    subject to ‖ŷ − y‖₁ ≤ ε,   Σ_k ŷ_k = 1,   ŷ ≥ 0,   ŷ_t − ŷ_j ≥ m  (j ≠ t, m = 1e-4)

Two exact solvers:

* ``solver="lp"``: the reference. One scipy ``linprog`` (HiGHS) per query, with slack variables z ≥ |ŷ − y|
  (the official code's PuLP formulation with HiGHS instead of CBC).
* ``solver="fast"`` (default): a batched structural solver. Derivation:

  1. *Reduce to one parameter.* Fix the top level h = ŷ_t. The remaining problem over the other classes is
     ``min Σ_{j≠t} c_j ŷ_j`` s.t. 0 ≤ ŷ_j ≤ u := h − m, Σ_{j≠t} ŷ_j = 1 − h, Σ_{j≠t} |ŷ_j − y_j| ≤ ε − |y_t − h|.
     The optimum of Eq. 9 is ``min_h F(h)`` with F the value of this inner problem. F is the value function of
     an LP whose right-hand side is affine in h, hence **convex** in h; its domain (the feasible h) is an interval.
  2. *Solve the inner problem greedily.* Classes above the cap are forced down: z_j = min(y_j, u), costing
     f = Σ (y_j − u)⁺ of ℓ1. The others must then change their total by N = y_t − h + f, so they gain
     N⁺ + s and lose N⁻ + s for some exchange amount s ≥ 0, with ℓ1 = |y_t − h| + f + |N| + 2s ≤ ε.
     For a given total gain A, the cheapest placement fills the classes in *ascending* c up to the cap u
     (a fractional knapsack: every unit of mass costs the same ℓ1, so only c matters); for a given total loss D
     the most valuable removal drains classes in *descending* c down to 0. Hence the inner cost
     Inc(N⁺ + s) − Dec(N⁻ + s) is convex in s, with non-decreasing marginal cost c_inc(·) and non-increasing
     marginal gain c_dec(·) (both step functions of s with breakpoints at the cumulative capacities), and the
     optimal s* is the first breakpoint where c_inc ≥ c_dec, or the budget/capacity bound, whichever is smaller.
  3. *Minimise over h.* The feasible interval [h_lo, h_hi] comes from the convex minimal-ℓ1 function
     g(h) = |y_t − h| + f(h) + |N(h)| and h ≥ (1 + (K − 1)m)/K (room for the others under the cap). F is convex on
     it, so golden-section search converges to the minimum; 52 iterations shrink the interval to 0.618⁵² ≈ 1.4e-11;
     |F'| ≤ 14·K bounds the objective error by ~2e-8 at K = 100 (tests: ≤ 1e-6 vs the LP). Where y has the top-1 margin
     the interval ends have closed forms (see ``solve``); near-tied rows find them by bisection.

  Everything is vectorised over the batch in float64 (the sort orders of c do not depend on h and are computed
  once; the pairing of receivers with donors is precomputed, so each F(h) is a handful of array passes).

Infeasible queries (only possible when y has no top-1 margin ≥ m and ε is too small to create one) are answered
with y itself by both solvers. The LP is degenerate where many y_k ≈ 0 share the cost log(1e-6): the two solvers
then return different optimal ŷ with the same objective.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from modelward.errors import ConfigError
from modelward.extraction.defenses.base import PredictionDefense

LOG_FLOOR = 1e-6  # c_k = log(y_k + 1e-6), as the official code
MARGIN = 1e-4  # strict top-1 margin of the official code
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def objective(y: Tensor, y_hat: Tensor) -> Tensor:
    """Per-row value of Eq. 9's objective Σ_k ŷ_k log(y_k + 1e-6)."""
    return (y_hat.to(torch.float64) * torch.log(y.to(torch.float64) + LOG_FLOOR)).sum(1)


def solve_lp(y: np.ndarray, epsilon: float, margin: float = MARGIN) -> np.ndarray | None:
    """Reference: solve Eq. 9 for one probability vector with scipy's HiGHS; None if infeasible."""
    from scipy.optimize import linprog

    k = y.shape[0]
    t = int(np.argmax(y))
    c = np.concatenate([np.log(y + LOG_FLOOR), np.zeros(k)])
    eye = np.eye(k)
    rows = [np.hstack([eye, -eye]), np.hstack([-eye, -eye]), np.concatenate([np.zeros(k), np.ones(k)])[None]]
    rhs = [y, -y, [epsilon]]
    others = [j for j in range(k) if j != t]
    if others:
        top = np.zeros((len(others), 2 * k))
        top[np.arange(len(others)), others] = 1.0
        top[:, t] = -1.0
        rows.append(top)
        rhs.append(np.full(len(others), -margin))
    a_eq = np.concatenate([np.ones(k), np.zeros(k)])[None]
    res = linprog(c, A_ub=np.vstack(rows), b_ub=np.concatenate(rhs), A_eq=a_eq, b_eq=[1.0],
                  bounds=[(0.0, 1.0)] * k + [(0.0, None)] * k, method="highs")
    if res.status != 0:
        return None
    return res.x[:k]


def _cumsum_rows(x: np.ndarray) -> np.ndarray:
    """[0, x0, x0+x1, ...] along axis 0 (a loop of row adds: numpy's axis-0 cumsum is slow for short axes)."""
    out = np.empty((x.shape[0] + 1, x.shape[1]))
    out[0] = 0.0
    for i in range(x.shape[0]):
        np.add(out[i], x[i], out=out[i + 1])
    return out


class _Fast:
    """Batched structural solver (see the module docstring) on float64 numpy rows.

    numpy rather than torch: the work is many tiny element-wise passes, where torch's per-op overhead and
    intra-op thread wake-ups dominate on a loaded CPU.
    """

    def __init__(self, y: np.ndarray, epsilon: float, margin: float) -> None:
        b, k = y.shape
        self.eps, self.m, self.k = epsilon, margin, k
        rows = np.arange(b)
        self.t = y.argmax(1)
        mask = np.ones_like(y, dtype=bool)
        mask[rows, self.t] = False
        self.mask = mask
        self.yt = y[rows, self.t]
        # class-major layout ((K−1) × B): reductions over classes become vector adds of contiguous rows
        self.yo = np.ascontiguousarray(y[mask].reshape(b, k - 1).T)
        c = np.log(y + LOG_FLOOR)
        self.ct = c[rows, self.t]
        self.co = np.ascontiguousarray(c[mask].reshape(b, k - 1).T)
        # stable orders so ties resolve identically every time (determinism)
        self.inc_order = np.argsort(self.co, axis=0, kind="stable")  # ascending c: filled first
        self.dec_order = np.argsort(-self.co, axis=0, kind="stable")  # descending c: drained first
        self.inc_inv = np.argsort(self.inc_order, axis=0)
        self.dec_inv = np.argsort(self.dec_order, axis=0)
        self.c_inc = np.take_along_axis(self.co, self.inc_order, 0)
        self.c_dec = np.take_along_axis(self.co, self.dec_order, 0)
        self.h_cap = (1.0 + (k - 1) * margin) / k
        # receiver i (incl. a virtual K-th with c = +inf: no capacity left) pairs with the first donor j whose
        # c_dec[j] ≤ c_inc[i] (a virtual last donor with c = -inf always qualifies)
        c_inc_ext = np.concatenate([self.c_inc, np.full((1, b), np.inf)], 0)
        c_dec_ext = np.concatenate([self.c_dec, np.full((1, b), -np.inf)], 0)
        self.j_first = (c_dec_ext[None, :, :] <= c_inc_ext[:, None, :]).argmax(1)  # K × B, first True along j
        self.zero = np.zeros((1, b))
        # flat indices: x.ravel()[idx] is a much faster take_along_axis for repeated use
        col = np.arange(b)[None, :]
        self.ix_inc, self.ix_dec = self.inc_order * b + col, self.dec_order * b + col
        self.ix_inc_inv, self.ix_dec_inv = self.inc_inv * b + col, self.dec_inv * b + col
        self.ix_j_first = self.j_first * b + col

    def _forced(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        u = np.maximum(h - self.m, 0.0)
        z = np.minimum(self.yo, u)
        f = (self.yo - z).sum(0)
        return u, z, f

    def min_l1(self, h: np.ndarray) -> np.ndarray:
        _, _, f = self._forced(h)
        return np.abs(self.yt - h) + f + np.abs(self.yt - h + f)

    def inner(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Value F(h) and the others' optimal values ((K−1)×B) for top level h (B,)."""
        u, z, f = self._forced(h)
        n = self.yt - h + f
        n_pos, n_neg = np.maximum(n, 0.0), np.maximum(-n, 0.0)
        budget = self.eps - np.abs(self.yt - h) - f
        cap_inc = (u - z).ravel()[self.ix_inc]
        cap_dec = z.ravel()[self.ix_dec]
        cum_inc = _cumsum_rows(cap_inc)  # cum_inc[i] = mass that fits before receiver i
        cum_dec = _cumsum_rows(cap_dec)
        s_hi = np.minimum(np.maximum((budget - np.abs(n)) / 2.0, 0.0),
                          np.maximum(np.minimum(cum_inc[-1] - n_pos, cum_dec[-1] - n_neg), 0.0))
        # s* = min over (receiver i, donor j) with c_inc[i] ≥ c_dec[j] of the first s where both are marginal;
        # for each i the best such j is the first one, j_first[i] (independent of h, computed once)
        start_inc = cum_inc - n_pos
        start_dec = cum_dec.ravel()[self.ix_j_first] - n_neg
        s_star = np.maximum(np.maximum(start_inc, start_dec), 0.0).min(0)
        s = np.minimum(s_star, s_hi)
        a, d = n_pos + s, n_neg + s
        inc = np.minimum(np.maximum(a - cum_inc[:-1], 0.0), cap_inc)
        dec = np.minimum(np.maximum(d - cum_dec[:-1], 0.0), cap_dec)
        others = z + inc.ravel()[self.ix_inc_inv] - dec.ravel()[self.ix_dec_inv]
        value = self.ct * h + (self.co * others).sum(0)
        return value, others

    @staticmethod
    def _golden(fn, lo: np.ndarray, hi: np.ndarray, iters: int = 52) -> np.ndarray:
        """Minimiser of a convex function on [lo, hi] (row-wise) by golden-section search (0.618⁵² ≈ 1.4e-11)."""
        a, b = lo.copy(), hi.copy()
        x1 = b - _GOLDEN * (b - a)
        x2 = a + _GOLDEN * (b - a)
        f1, f2 = fn(x1), fn(x2)
        for _ in range(iters):
            left = f1 <= f2  # the minimum lies in [a, x2]; otherwise in [x1, b]
            b = np.where(left, x2, b)
            a = np.where(left, a, x1)
            x_new = np.where(left, b - _GOLDEN * (b - a), a + _GOLDEN * (b - a))
            f_new = fn(x_new)  # one evaluation per iteration: the other probe is reused
            x1, x2, f1, f2 = (np.where(left, x_new, x2), np.where(left, x1, x_new),
                              np.where(left, f_new, f2), np.where(left, f1, f_new))
        return (a + b) / 2.0

    def _bisect(self, ok_at: np.ndarray, bad_at: np.ndarray, iters: int = 54) -> np.ndarray:
        """Boundary of {h : min_l1(h) ≤ ε} between a feasible and an infeasible point (returns the feasible end)."""
        ok, bad = ok_at.copy(), bad_at.copy()
        for _ in range(iters):
            mid = (ok + bad) / 2.0
            good = self.min_l1(mid) <= self.eps
            ok = np.where(good, mid, ok)
            bad = np.where(good, bad, mid)
        return ok

    def solve(self) -> tuple[np.ndarray, np.ndarray]:
        """Optimal ŷ (B×K) and a feasibility mask (B,)."""
        b = self.yt.shape[0]
        lo0 = np.full(b, self.h_cap)
        hi0 = np.ones(b)
        # Rows where y already has the top-1 margin (f(y_t) = 0): g(h) = 2(h − y_t) above y_t, so h_hi = y_t + ε/2;
        # below y_t, g(h) = 2(y_t − h + Σ_j (y_j + m − h)⁺) is decreasing piecewise linear and g(h) = ε solves in
        # closed form as max_k (y_t + Σ_{i≤k} a_i − ε/2)/(k + 1) over the sorted a_i = y_j + m (descending), the
        # same argument as the threshold of a Euclidean simplex projection. Near-tied rows use bisection.
        _, _, f_t = self._forced(self.yt)
        ok = f_t <= 0.0
        a = -np.sort(-(self.yo + self.m), axis=0)
        ks = np.arange(self.k)[:, None]
        h_k = (self.yt + np.concatenate([self.zero, a.cumsum(0)], 0) - self.eps / 2.0) / (ks + 1.0)
        lo = np.maximum(lo0, np.minimum(h_k.max(0), self.yt))
        hi = np.minimum(hi0, self.yt + self.eps / 2.0)
        feasible = np.ones(b, dtype=bool)
        if not ok.all():
            h_g = np.where(ok, self.yt, self._golden(self.min_l1, lo0, hi0))
            feasible = self.min_l1(h_g) <= self.eps + 1e-9  # search precision; the LP tolerance is ~1e-7
            lo_ok, hi_ok = self.min_l1(lo0) <= self.eps, self.min_l1(hi0) <= self.eps
            lo = np.where(ok, lo, np.where(lo_ok, lo0, self._bisect(h_g, lo0)))
            hi = np.where(ok, hi, np.where(hi_ok, hi0, self._bisect(h_g, hi0)))
        h = self._golden(lambda x: self.inner(x)[0], lo, hi)
        _, others = self.inner(h)
        out = np.empty((b, self.k))
        out[self.mask] = others.T.reshape(-1)
        out[np.arange(b), self.t] = h
        return out, feasible


class ModelGuardW(PredictionDefense):
    """ModelGuard-W: the exact optimum of Eq. 9 per query (ℓ1 ≤ ε, top-1 kept with margin 1e-4, simplex)."""

    name = "modelguard_w"

    def __init__(self, epsilon: float = 1.0, solver: str = "fast", margin: float = MARGIN) -> None:
        if not 0.0 <= epsilon <= 2.0:
            raise ConfigError(f"defense modelguard_w: epsilon must be in [0, 2] (ℓ1 on the simplex), got {epsilon!r}")
        if solver not in ("fast", "lp"):
            raise ConfigError(f"defense modelguard_w: solver must be 'fast' or 'lp', got {solver!r}")
        if not 0.0 <= margin < 0.5:
            raise ConfigError(f"defense modelguard_w: margin must be in [0, 0.5), got {margin!r}")
        self.epsilon = float(epsilon)
        self.solver = solver
        self.margin = float(margin)

    def _defend(self, y: Tensor, x: Tensor | None) -> Tensor:
        if y.shape[0] == 0:
            return y.clone()
        if self.solver == "lp":
            rows = []
            for row in y.numpy():
                sol = solve_lp(row, self.epsilon, self.margin)
                rows.append(row if sol is None else sol)
            out = torch.from_numpy(np.stack(rows)).to(torch.float64)
        else:
            sol, feasible = _Fast(y.numpy(), self.epsilon, self.margin).solve()
            out = torch.from_numpy(np.where(feasible[:, None], sol, y.numpy()))
        out = out.clamp_min(0.0)
        return out / out.sum(1, keepdim=True)

    def params(self) -> dict[str, float | int | str | bool | None]:
        return {"epsilon": self.epsilon, "solver": self.solver, "margin": self.margin}
