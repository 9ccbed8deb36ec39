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
     g(h) = |y_t − h| + f(h) + |N(h)| and h ≥ (1 + (K − 1)m)/K (room for the others under the cap). Where y has
     the top-1 margin its ends have closed forms (see ``solve``); otherwise g is piecewise linear with kinks at
     y_t, y_j + m and the root of N, and evaluating it there gives the ends exactly (``_feasible_interval``).
     F is convex and piecewise linear on the interval and its minimiser is a kink. Golden-section search
     brackets it, and from the 6th step on every 2nd step tries to *certify* it (``_certify``): the chord of two
     consecutive samples lies below a convex F outside their interval, so the chords around the bracket give a
     lower bound whose minimum sits where two chords cross; once the kink is alone in its piece of the bracket
     that crossing IS the kink, F there equals the bound (≤ 1e-10), and the row stops with its exact optimum.
     Rows stop after ~10–20 evaluations instead of ~55 (a hard cap of 52 golden steps, 0.618⁵² ≈ 1.4e-11, remains
     for rows that never certify). A finite candidate set exists (the LP's vertices) but I found none of size
     O(K): a vertex fixes h through (number of drained donors, number of filled receivers, which classes are
     capped) — O(K²) combinations per interval between the y_j + m — so enumerating it costs more than the search.

  Everything is vectorised over the batch in float64 (the sort orders of c do not depend on h and are computed
  once; the pairing of receivers with donors is precomputed, so each F(h) is a handful of array passes); batches
  are solved in blocks of ~25k values so the temporaries stay in cache. The fill/drain prefix sums have closed
  forms (y is sorted along both orders), so an evaluation has no Python loop over classes.

Infeasible queries (only possible when y has no top-1 margin ≥ m and ε is too small to create one) are answered
with y itself by both solvers. The margin m must be strictly positive (m = 0 would let the optimum tie the top
class with another, so argmax could name a different label), and every answer is checked: a row whose top class
is not strictly first after normalisation is answered with y unchanged, so ModelGuard-W never returns a tie at the
top that y did not already have. The LP is degenerate where many y_k ≈ 0 share the cost log(1e-6): the two solvers
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
_MAX_ITERS = 52  # golden-section steps at most: 0.618⁵² ≈ 1.4e-11 of the initial interval
_CERT_START, _CERT_EVERY = 6, 2  # try the optimality certificate after 6 steps, then every 2nd step
_BLOCK_VALUES = 25_000  # batch rows × classes solved at once (measured best of 12.8k–100k at K = 100)
_CERT_TOL = 1e-10  # a row stops when its best value is within this of the certified lower bound


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


def _inverse(order: np.ndarray) -> np.ndarray:
    """Inverse permutations of the columns of ``order`` (a scatter; cheaper than another argsort)."""
    inv = np.empty_like(order)
    np.put_along_axis(inv, order, np.arange(order.shape[0])[:, None], 0)
    return inv


def _min_l1_at(yt: np.ndarray, yo: np.ndarray, m: float, hs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """g(h), the least ℓ1 needed for top level h, and φ(h) = y_t − h + f(h), at points ``hs`` (M × B)."""
    u = np.maximum(hs - m, 0.0)[:, None, :]
    f = np.maximum(yo[None] - u, 0.0).sum(1)  # forced reduction Σ (y_j − u)⁺
    phi = yt - hs + f
    return np.abs(yt - hs) + f + np.abs(phi), phi


def _crossing(hs: np.ndarray, gs: np.ndarray, level: np.ndarray | float, i: np.ndarray) -> np.ndarray:
    """Where the linear piece of g between samples i and i + 1 (rows of ``hs``/``gs``) takes ``level``."""
    cols = np.arange(hs.shape[1])
    h0, h1, g0, g1 = hs[i, cols], hs[i + 1, cols], gs[i, cols], gs[i + 1, cols]
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.clip((g0 - level) / (g0 - g1), 0.0, 1.0)
    return np.where(np.isfinite(t), h0 + t * (h1 - h0), h0)


def _feasible_interval(yt: np.ndarray, yo: np.ndarray, m: float, eps: float,
                       h_cap: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """{h ∈ [h_cap, 1] : g(h) ≤ ε} for rows without the top-1 margin: g is convex piecewise linear with kinks at
    y_t, at y_j + m and at the root h0 of the decreasing φ, so evaluating it there and interpolating linearly on
    the crossing pieces gives the interval's ends exactly. Returns (lo, hi, feasible)."""
    b = yt.shape[0]
    pts = np.concatenate([np.full((1, b), h_cap), np.ones((1, b)), yt[None], yo + m], 0)
    pts = np.sort(np.clip(pts, h_cap, 1.0), axis=0)
    _, phi = _min_l1_at(yt, yo, m, pts)
    # φ decreases: its root lies on the last piece starting with φ ≥ 0 (or at an end)
    i = np.clip((phi >= 0).sum(0) - 1, 0, pts.shape[0] - 2)
    h0 = _crossing(pts, phi, 0.0, i)
    pts = np.sort(np.concatenate([pts, h0[None]], 0), axis=0)
    g, _ = _min_l1_at(yt, yo, m, pts)
    cols = np.arange(b)
    j = g.argmin(0)
    feasible = g[j, cols] <= eps + 1e-12
    n = pts.shape[0]
    rows = np.arange(n)[:, None]
    # lo: on the last piece left of the minimum that starts above ε; hi: the first right of it that ends above ε
    above = g > eps
    i_lo = np.where(above & (rows < j), rows, -1).max(0)
    lo = np.where(i_lo < 0, pts[0], _crossing(pts, g, eps, np.maximum(i_lo, 0)))
    i_hi = np.where(above & (rows > j), rows, n).min(0)
    hi = np.where(i_hi >= n, pts[-1], _crossing(pts, g, eps, np.minimum(i_hi, n - 1) - 1))
    lo, hi = np.where(feasible, lo, pts[j, cols]), np.where(feasible, hi, pts[j, cols])
    return lo, np.maximum(hi, lo), feasible


def _certify(p: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A lower bound of a convex F on [p1, p4] from six ascending samples p0 < … < p5 (p0, p5 may be NaN), and
    where to probe next.

    The chord of two consecutive samples lies below F outside their interval, so on each interval [p_i, p_i+1]
    (i = 1, 2, 3) F ≥ max(chord(i−1, i), chord(i+1, i+2)). For a piecewise-linear F whose kink (the minimiser)
    lies in that interval with no other kink in the two neighbouring intervals, the bound is attained where the
    two chords cross, so probing there certifies the exact minimiser (golden-section search alone would only
    approach it geometrically).
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = (v[1:] - v[:-1]) / (p[1:] - p[:-1])  # chords 0..4
        sl, sr = slope[0:3], slope[2:5]  # left / right neighbour chords of intervals 1..3
        pl, vl, pr, vr = p[0:3], v[0:3], p[2:5], v[2:5]
        lo, hi = p[1:4], p[2:5]
        cross = np.clip((vr - vl + sl * pl - sr * pr) / (sl - sr), lo, hi)
        cross = np.where(np.isfinite(cross), cross, (lo + hi) / 2.0)

        def bound_at(x: np.ndarray) -> np.ndarray:
            left, right = vl + sl * (x - pl), vr + sr * (x - pr)
            left, right = np.where(np.isfinite(left), left, -np.inf), np.where(np.isfinite(right), right, -np.inf)
            return np.maximum(left, right)

        bounds = np.minimum(np.minimum(bound_at(lo), bound_at(hi)), bound_at(cross))
    j = bounds.argmin(0)
    cols = np.arange(j.shape[0])
    return cross[j, cols], bounds[j, cols]


class _Fast:
    """Batched structural solver (see the module docstring) on float64 numpy rows.

    numpy rather than torch: the work is many tiny element-wise passes, where torch's per-op overhead and
    intra-op thread wake-ups dominate on a loaded CPU.
    """

    def __init__(self, y: np.ndarray, epsilon: float, margin: float) -> None:
        b, k = y.shape
        self.y = y
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
        # stable orders so ties resolve identically every time (determinism); sorted along contiguous rows
        co_rows = c[mask].reshape(b, k - 1)
        self.inc_order = np.ascontiguousarray(np.argsort(co_rows, axis=1, kind="stable").T)  # ascending c: filled
        # descending c: drained first (ties in reverse class order)
        self.dec_order = np.ascontiguousarray(self.inc_order[::-1])
        self.inc_inv = _inverse(self.inc_order)
        self.dec_inv = (k - 2) - self.inc_inv
        self.c_inc = np.take_along_axis(self.co, self.inc_order, 0)
        self.c_dec = np.ascontiguousarray(self.c_inc[::-1])
        self.yo_inc = np.take_along_axis(self.yo, self.inc_order, 0)
        self.yo_dec = np.ascontiguousarray(self.yo_inc[::-1])
        self.p_inc = np.concatenate([np.zeros((1, b)), np.cumsum(self.yo_inc, 0)], 0)  # K × B: Σ_{l<i} y_l
        self.p_dec = np.concatenate([np.zeros((1, b)), np.cumsum(self.yo_dec, 0)], 0)
        self.h_cap = (1.0 + (k - 1) * margin) / k
        # receiver i (incl. a virtual K-th with c = +inf: no capacity left) pairs with the first donor j whose
        # c_dec[j] ≤ c_inc[i] (a virtual last donor with c = -inf always qualifies). c_dec is c in descending
        # order, so that j is #{c > c_inc[i]} = (K − 1) − (end of c_inc[i]'s run of equal values in c_inc) − 1.
        pos = np.arange(k - 1)[:, None]
        boundary = np.ones((k - 1, b), dtype=bool)
        boundary[:-1] = self.c_inc[1:] != self.c_inc[:-1]
        run_end = np.minimum.accumulate(np.where(boundary, pos, k)[::-1], axis=0)[::-1]
        self.j_first = np.concatenate([(k - 2) - run_end, np.zeros((1, b), dtype=np.int64)], 0)  # K × B
        self._index()

    _COLUMN_ARRAYS = ("y", "t", "yt", "yo", "ct", "co", "inc_order", "dec_order", "inc_inv", "dec_inv", "c_inc",
                      "c_dec", "j_first", "yo_inc", "yo_dec", "p_inc", "p_dec")

    def _index(self) -> None:
        b = self.yt.shape[0]
        self.zero = np.zeros((1, b))
        self.pos = np.arange(self.k, dtype=np.float64)[:, None]
        self.b, self.col = b, np.arange(b)
        # flat indices: x.ravel()[idx] is a much faster take_along_axis for repeated use
        col = np.arange(b)[None, :]
        self.ix_inc, self.ix_dec = self.inc_order * b + col, self.dec_order * b + col
        self.ix_inc_inv, self.ix_dec_inv = self.inc_inv * b + col, self.dec_inv * b + col
        self.ix_j_first = self.j_first * b + col

    def take(self, cols: np.ndarray) -> _Fast:
        """The solver restricted to the batch rows ``cols`` (no re-sorting)."""
        sub = object.__new__(_Fast)
        sub.eps, sub.m, sub.k, sub.h_cap = self.eps, self.m, self.k, self.h_cap
        for name in self._COLUMN_ARRAYS:
            arr = getattr(self, name)
            setattr(sub, name, arr[cols] if name in ("y", "t", "yt", "ct") else np.ascontiguousarray(arr[:, cols]))
        sub.mask = None
        sub._index()
        return sub

    def _forced(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        u = np.maximum(h - self.m, 0.0)
        z = np.minimum(self.yo, u)
        f = (self.yo - z).sum(0)
        return u, z, f

    def min_l1(self, h: np.ndarray) -> np.ndarray:
        _, _, f = self._forced(h)
        return np.abs(self.yt - h) + f + np.abs(self.yt - h + f)

    def inner(self, h: np.ndarray, values_only: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        """Value F(h) and the others' optimal values ((K−1)×B) for top level h (B,)."""
        u = np.maximum(h - self.m, 0.0)
        cap_inc = np.maximum(u - self.yo_inc, 0.0)  # room below the cap, in fill order
        cap_dec = np.minimum(self.yo_dec, u)  # capped values (what can be drained), in drain order
        # prefix sums in closed form (no loop over classes): y ascends in fill order, so the room is positive for
        # exactly the first r receivers, and cum_inc[i] = i·u − Σ_{l<i} y_l up to r, constant after; y descends in
        # drain order, so the first r' classes are capped at u and cum_dec[i] = i·u up to r', then grows by y_l
        pos = self.pos
        r = (self.yo_inc < u).sum(0)
        q = pos * u - self.p_inc
        cum_inc = np.where(pos <= r, q, q.ravel()[r * self.b + self.col])  # cum_inc[i]: fits before receiver i
        r2 = (self.yo_dec > u).sum(0)
        cum_dec = np.where(pos <= r2, pos * u, r2 * u + self.p_dec - self.p_dec.ravel()[r2 * self.b + self.col])
        f = np.maximum(self.p_dec[-1] - cum_dec[-1], 0.0)  # forced reduction Σ (y_j − u)⁺
        n = self.yt - h + f
        n_pos, n_neg = np.maximum(n, 0.0), np.maximum(-n, 0.0)
        budget = self.eps - np.abs(self.yt - h) - f
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
        if values_only:
            return self.ct * h + (self.c_dec * (cap_dec - dec)).sum(0) + (self.c_inc * inc).sum(0), None
        others = np.minimum(self.yo, u) + inc.ravel()[self.ix_inc_inv] - dec.ravel()[self.ix_dec_inv]
        value = self.ct * h + (self.co * others).sum(0)
        return value, others

    def value(self, h: np.ndarray) -> np.ndarray:
        """F(h) alone (cheaper than :meth:`inner`: no scatter back to class order)."""
        return self.inner(h, values_only=True)[0]

    def _minimise(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Minimiser of the convex piecewise-linear F on [lo, hi] (row-wise): golden-section search that stops
        each row as soon as a lower bound certifies the best point found (see :func:`_certify`)."""
        out = (lo + hi) / 2.0
        idx = np.arange(lo.shape[0])
        fast = self
        a, b = lo.copy(), hi.copy()
        fa, fb = fast.value(a), fast.value(b)
        x1, x2 = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
        f1, f2 = fast.value(x1), fast.value(x2)
        a_out, fa_out = np.full_like(a, np.nan), np.full_like(a, np.nan)  # the last samples left of a / right of b
        b_out, fb_out = a_out.copy(), a_out.copy()
        finished = np.zeros(a.shape[0], dtype=bool)
        for it in range(1, _MAX_ITERS + 1):
            left = f1 <= f2  # the minimum lies in [a, x2]; otherwise in [x1, b]
            b_out, fb_out = np.where(left, b, b_out), np.where(left, fb, fb_out)
            a_out, fa_out = np.where(left, a_out, a), np.where(left, fa_out, fa)
            b, fb = np.where(left, x2, b), np.where(left, f2, fb)
            a, fa = np.where(left, a, x1), np.where(left, fa, f1)
            x_new = np.where(left, b - _GOLDEN * (b - a), a + _GOLDEN * (b - a))
            f_new = fast.value(x_new)  # one evaluation per iteration: the other probe is reused
            x1, x2, f1, f2 = (np.where(left, x_new, x2), np.where(left, x1, x_new),
                              np.where(left, f_new, f2), np.where(left, f1, f_new))
            if it < _CERT_START or (it - _CERT_START) % _CERT_EVERY and it < _MAX_ITERS:
                continue
            pts = np.stack([a_out, a, x1, x2, b, b_out])
            vals = np.stack([fa_out, fa, f1, f2, fb, fb_out])
            x_star, bound = _certify(pts, vals)
            f_star = fast.value(x_star)
            pts, vals = np.stack([a, x1, x2, b, x_star]), np.stack([fa, f1, f2, fb, f_star])
            best = vals.argmin(0)
            cols = np.arange(best.shape[0])
            done = (vals[best, cols] - bound <= _CERT_TOL) | (b - a <= 1e-15) | (it == _MAX_ITERS) | finished
            new = done & ~finished
            out[idx[new]] = pts[best, cols][new]
            finished = done
            if done.all():
                break
            if done.mean() > 0.3:  # continue with the uncertified rows only (compacting costs a few passes)
                keep = ~done
                finished = finished[keep]
                idx = idx[keep]
                a, b, x1, x2, fa, fb, f1, f2, a_out, fa_out, b_out, fb_out = (
                    v[keep] for v in (a, b, x1, x2, fa, fb, f1, f2, a_out, fa_out, b_out, fb_out))
                fast = fast.take(np.nonzero(keep)[0])
        return out

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
        if not ok.all():  # near-tied rows: the feasible interval from g's breakpoints (exact, no search)
            nk = np.nonzero(~ok)[0]
            lo_n, hi_n, feas_n = _feasible_interval(self.yt[nk], self.yo[:, nk], self.m, self.eps, self.h_cap)
            lo[nk], hi[nk], feasible[nk] = lo_n, hi_n, feas_n
        h = self._minimise(lo, hi)
        _, others = self.inner(h)
        out = np.empty((b, self.k))
        out[self.mask] = others.T.reshape(-1)
        out[np.arange(b), self.t] = h
        return out, feasible


class ModelGuardW(PredictionDefense):
    """ModelGuard-W: the exact optimum of Eq. 9 per query (ℓ1 ≤ ε, top-1 kept with margin 1e-4, simplex).

    Args:
        epsilon: the ℓ1 budget ε of Eq. 5, in [0, 2].
        solver: ``"fast"`` (exact golden-section solver with an optimality certificate) or ``"lp"`` (scipy HiGHS,
            the reference).
        margin: the strict top-1 margin of Eq. 9 (the official code's 1e-4).

    Returns:
        ``defense.defend(probs)`` (``probs``: a B × K batch of probability vectors) returns the perturbed vectors,
        B × K on the simplex; ``x=`` passes the queried inputs to defenses that need them.

    Example:
        >>> import torch
        >>> y = torch.tensor([[0.7, 0.2, 0.1], [0.4, 0.35, 0.25]])
        >>> out = ModelGuardW(epsilon=0.5).defend(y)
        >>> bool((out - y).abs().sum(1).max() <= 0.5 + 1e-6), out.argmax(1).tolist()
        (True, [0, 0])
    """

    name = "modelguard_w"

    def __init__(self, epsilon: float = 1.0, solver: str = "fast", margin: float = MARGIN) -> None:
        if not 0.0 <= epsilon <= 2.0:
            raise ConfigError(f"defense modelguard_w: epsilon must be in [0, 2] (ℓ1 on the simplex), got {epsilon!r}")
        if solver not in ("fast", "lp"):
            raise ConfigError(f"defense modelguard_w: solver must be 'fast' or 'lp', got {solver!r}")
        if not 0.0 < margin < 0.5:
            raise ConfigError(f"defense modelguard_w: margin must be in (0, 0.5), got {margin!r}: with margin 0 the "
                              "optimum ties the top class with another one (Eq. 9's strict top-1 constraint)")
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
            out = np.stack(rows).astype(np.float64)
        else:
            yn = y.numpy()
            out = np.empty_like(yn)
            # rows are independent: blocks of ~25k values keep the solver's temporaries in cache
            step = max(128, _BLOCK_VALUES // yn.shape[1])
            for i in range(0, yn.shape[0], step):
                sol, feasible = _Fast(yn[i:i + step], self.epsilon, self.margin).solve()
                out[i:i + step] = np.where(feasible[:, None], sol, yn[i:i + step])
        # numpy: torch's intra-op threads make these two passes cost milliseconds on a busy CPU
        res = np.maximum(out, 0.0)
        res /= res.sum(1, keepdims=True)
        # never a tie at the top: a row whose answer does not keep y's top class strictly first (rounding, or an
        # infeasible LP) is answered with y unchanged
        yn = y.numpy()
        rows = np.arange(len(res))
        t = yn.argmax(1)
        others = res.copy()
        others[rows, t] = -np.inf
        bad = res[rows, t] <= others.max(1)
        if bad.any():
            res[bad] = yn[bad]
        return torch.from_numpy(res)

    def params(self) -> dict[str, float | int | str | bool | None]:
        return {"epsilon": self.epsilon, "solver": self.solver, "margin": self.margin}
