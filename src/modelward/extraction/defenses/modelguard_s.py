"""ModelGuard-S (ModelGuard paper, Sec. 3.4, Algorithm 1: ordered incremental prediction quantization).

Per top-1 class t an ordered list of centroids C_t. For each query's clean prediction y (top-1 t):

    if C_t is empty or min_{c ∈ C_t} ‖c − y‖₁ > ε:  append y to the END of C_t
    return the FIRST centroid (insertion order) of C_t within ℓ1 distance ε of y

Every answer is an earlier clean prediction with the same top-1, so ℓ1 ≤ ε, the top-1 label and the simplex hold
exactly; centroids are only appended, so once y is covered its answer never changes (no leakage through
inconsistency, Eq. 17–18). ``ordered=False`` is the *non-ordered* variant of the Table 6 ablation: the nearest
centroid within ε instead of the first, which can change an old answer when a closer centroid appears.

Lookup (exact, no Python loop over centroids): a float32 ℓ2 pre-filter over all of a class's centroids in one BLAS
product (ℓ1 ≥ ℓ2, so it never drops a centroid within ℓ1 ε), then a float64 ℓ1 check of the surviving candidates
in insertion order. The per-class buffers grow in place on append; nothing is rebuilt per query.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from modelward.core.io import load_tensors, save_tensors
from modelward.errors import ConfigError, DataError
from modelward.extraction.defenses.base import PredictionDefense, as_probs

_CHUNK = 8  # query rows per pre-filter pass (bounds the B × N score block and the candidate lists)
_EXACT_BLOCK = 1024  # candidates of one query checked exactly at once (insertion order, early exit)
_EXACT_LIMIT = 1 << 15  # more candidates than this in a query block: check them query by query
_D2_SLACK = 1e-5  # float32 rounding allowance on ‖c − y‖₂² (terms ≤ 2, error ≲ K·2.4e-7; see candidates)


class _ClassCentroids:
    """One class's ordered centroid list in growable buffers, kept up to date on append (never rebuilt).

    ``buf`` (float64, row-major) holds the exact centroids. ``aug32`` (float32, class-major: (K + 1) × capacity)
    holds the column [c, −‖c‖²/2] per centroid: since ‖c − y‖₁ ≥ ‖c − y‖₂ and ‖c − y‖₂² = ‖c‖² + ‖y‖² − 2c·y, a
    centroid can be within ℓ1 ε of y only if [y, 1]·[c, −‖c‖²/2] ≥ (‖y‖² − ε²)/2 — one BLAS product for all
    centroids (class-major: long contiguous rows, ≈ 5× faster than an N × (K + 1) mat-vec). Only the centroids
    passing this pre-filter (with a float32 slack) are compared exactly, in float64.
    """

    def __init__(self, k: int) -> None:
        self.buf = np.empty((16, k))
        self.aug32 = np.empty((k + 1, 16), dtype=np.float32)
        self.n = 0

    def centroid(self, i: int) -> np.ndarray:
        return self.buf[i]

    def append(self, y: np.ndarray) -> int:
        if self.n == self.buf.shape[0]:
            grown = np.empty((2 * self.n, self.buf.shape[1]))
            grown[: self.n] = self.buf[: self.n]
            self.buf = grown
            grown32 = np.empty((self.aug32.shape[0], 2 * self.n), dtype=np.float32)
            grown32[:, : self.n] = self.aug32[:, : self.n]
            self.aug32 = grown32
        self.buf[self.n] = y
        col = y.astype(np.float32)
        self.aug32[:-1, self.n] = col
        self.aug32[-1, self.n] = -0.5 * float(np.dot(col, col))
        self.n += 1
        return self.n - 1

    def scores(self, lo: int, hi: int, ys: np.ndarray) -> np.ndarray:
        """[y, 1]·[c, −‖c‖²/2] for queries ``ys`` (B × K) and centroids lo..hi−1: a B × (hi − lo) float32 array."""
        q = _augment(ys)
        if ys.shape[0] == 1:
            return q @ self.aug32[:, lo:hi]
        # column blocks keep each product under OpenBLAS's threading threshold (M·N·K ≤ 2¹⁸): on a busy 2-core
        # machine its worker threads make one large product 100× slower than these small ones
        out = np.empty((ys.shape[0], hi - lo), dtype=np.float32)
        step = max(64, (1 << 18) // (ys.shape[0] * q.shape[1]))
        for s in range(lo, hi, step):
            e = min(hi, s + step)
            np.matmul(q, self.aug32[:, s:e], out=out[:, s - lo:e - lo])
        return out

    def candidates(self, lo: int, hi: int, ys: np.ndarray, eps: float) -> np.ndarray:
        """Bool mask (len(ys) × (hi − lo)): centroids lo..hi−1 that pass the ℓ2 pre-filter for each query."""
        return self.scores(lo, hi, ys) >= _threshold(ys, eps).astype(np.float32)[:, None]


def _augment(ys: np.ndarray) -> np.ndarray:
    """Query rows [y, 1] in float32 (the pre-filter's right-hand side)."""
    q = np.empty((ys.shape[0], ys.shape[1] + 1), dtype=np.float32)
    q[:, :-1] = ys
    q[:, -1] = 1.0
    return q


def _threshold(ys: np.ndarray, eps: float) -> np.ndarray:
    """Per query, the pre-filter bound (‖y‖² − ε²)/2, lowered by a slack for float32 rounding: absolute (it must
    admit exact duplicates at ε = 0) and growing with K (the products' rounding error)."""
    return 0.5 * ((ys * ys).sum(1) - eps * eps - _D2_SLACK - 3e-7 * ys.shape[1])


class ModelGuardS(PredictionDefense):
    """Algorithm 1 with ℓ1 radius ``epsilon``; stateful (centroids), deterministic for repeated queries.

    Queries inside a batch are processed in arrival order, exactly as if sent one by one. ``defend_frozen`` answers
    without adding centroids (the attacker's offline copy, the official ``frozen`` quantizer: an uncovered y is
    answered with the class's nearest centroid, possibly farther than ε, so the Partial Bayes attacker's
    "drop entries above ε" filter removes it; an empty class answers y itself). The state
    (centroids in global insertion order with their classes) round-trips through :meth:`state_dict` /
    :meth:`load_state_dict` and :meth:`save` / :meth:`load` (safetensors).

    Args:
        epsilon: the ℓ1 radius ε of Algorithm 1, in [0, 2].
        ordered: answer with the *first* centroid within ε (the paper's order-preserving rule); False = the
            nearest-centroid quantizer of the Table 6 ablation.

    Returns:
        ``defense.defend(probs)`` (``probs``: a B × K batch of probability vectors) returns the perturbed vectors,
        B × K on the simplex; ``x=`` passes the queried inputs to defenses that need them.

    Example:
        >>> import torch
        >>> y = torch.tensor([[0.7, 0.2, 0.1], [0.4, 0.35, 0.25]])
        >>> guard = ModelGuardS(epsilon=0.5)
        >>> a = guard.defend(y)
        >>> torch.equal(guard.defend(y), a), guard.num_centroids  # repeated queries: same answers, no new centroid
        (True, 2)
    """

    name = "modelguard_s"
    fast = True  # a full batch answers in well under a millisecond (the guard skips the thread hop)
    stateful = True

    def __init__(self, epsilon: float = 1.0, ordered: bool = True) -> None:
        if not 0.0 <= epsilon <= 2.0:
            raise ConfigError(f"defense modelguard_s: epsilon must be in [0, 2] (ℓ1 on the simplex), got {epsilon!r}")
        self.epsilon = float(epsilon)
        self.ordered = bool(ordered)
        self.num_classes: int | None = None
        self._classes: list[_ClassCentroids] = []
        self._order: list[tuple[int, int]] = []  # global insertion order: (class, index in class)
        self.queries_seen = 0
        self.growth: list[tuple[int, int]] = []  # (queries seen, centroids) each time a centroid is added

    # ---------------------------------------------------------------- state
    @property
    def num_centroids(self) -> int:
        return len(self._order)

    def centroid_counts(self) -> list[int]:
        return [c.n for c in self._classes]

    def _ensure_classes(self, k: int) -> None:
        if self.num_classes is None:
            self.num_classes = k
            self._classes = [_ClassCentroids(k) for _ in range(k)]
        elif k != self.num_classes:
            raise DataError(f"modelguard_s: queries have {k} classes but the centroid state has {self.num_classes}")

    def state_dict(self) -> dict[str, Tensor]:
        k = self.num_classes or 0
        cents = (np.stack([self._classes[c].centroid(i) for c, i in self._order]) if self._order
                 else np.zeros((0, k)))
        labels = np.array([c for c, _ in self._order], dtype=np.int64)
        growth = np.array(self.growth, dtype=np.int64).reshape(-1, 2)
        return {"centroids": torch.from_numpy(cents), "labels": torch.from_numpy(labels),
                "num_classes": torch.tensor([k], dtype=torch.int64),
                "queries_seen": torch.tensor([self.queries_seen], dtype=torch.int64),
                "growth": torch.from_numpy(growth)}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        missing = {"centroids", "labels", "num_classes"} - set(state)
        if missing:
            raise DataError(f"modelguard_s state: missing tensors {sorted(missing)}")
        cents = state["centroids"].to(torch.float64).numpy()
        labels = state["labels"].to(torch.int64).numpy()
        k = int(state["num_classes"][0])
        if cents.ndim != 2 or cents.shape[0] != labels.shape[0] or (cents.shape[0] and cents.shape[1] != k):
            raise DataError(f"modelguard_s state: inconsistent shapes centroids={list(cents.shape)}, "
                            f"labels={list(labels.shape)}, num_classes={k}")
        if labels.size and (labels.min() < 0 or labels.max() >= k):
            raise DataError("modelguard_s state: centroid labels out of range")
        self.num_classes = None
        self._classes, self._order = [], []
        if k:
            self._ensure_classes(k)
            for y, c in zip(cents, labels, strict=True):
                self._order.append((int(c), self._classes[int(c)].append(y)))
        self.queries_seen = int(state["queries_seen"][0]) if "queries_seen" in state else 0
        self.growth = [tuple(r) for r in state["growth"].tolist()] if "growth" in state else []

    def centroids_since(self, start: int) -> tuple[np.ndarray, np.ndarray]:
        """The centroids added after the first ``start`` (global insertion order): (labels (n,), vectors (n, K))."""
        new = self._order[start:]
        k = self.num_classes or 0
        if not new:
            return np.zeros(0, dtype=np.int64), np.zeros((0, k))
        return (np.array([c for c, _ in new], dtype=np.int64),
                np.stack([self._classes[c].centroid(i) for c, i in new]))

    def truncate_centroids(self, n: int) -> None:
        """Drop the centroids after the first ``n`` (global insertion order): undo a batch whose answer the guard
        could not commit, so memory never holds a centroid the store lacks."""
        if not 0 <= n <= len(self._order):
            raise DataError(f"modelguard_s: cannot truncate {len(self._order)} centroids to {n}")
        while len(self._order) > n:
            c, i = self._order.pop()
            self._classes[c].n = i  # appended last in its class: the buffer's tail is ignored from now on
        self.growth = [g for g in self.growth if g[1] <= n]

    def extend_centroids(self, labels: np.ndarray, vectors: np.ndarray) -> None:
        """Append centroids in order (replaying :meth:`centroids_since` of a later state onto an earlier one)."""
        if len(labels) == 0:
            return
        vectors = np.asarray(vectors, dtype=np.float64)
        self._ensure_classes(vectors.shape[1])
        k = self.num_classes or 0
        if labels.min() < 0 or labels.max() >= k:
            raise DataError("modelguard_s state: centroid labels out of range")
        for y, c in zip(vectors, labels, strict=True):
            self._order.append((int(c), self._classes[int(c)].append(y)))

    def save(self, path: str | Path) -> None:
        save_tensors(path, self.state_dict(), {"defense": self.name, "epsilon": repr(self.epsilon)})

    def load(self, path: str | Path) -> None:
        self.load_state_dict(load_tensors(path))

    # ---------------------------------------------------------------- lookup
    def _match(self, cls: _ClassCentroids, lo: int, hi: int, ys: np.ndarray) -> np.ndarray:
        """For each row of ``ys``, the index (in ``cls``) of its answer among centroids lo..hi−1, or -1.

        Ordered: the first centroid (insertion order) within ℓ1 ε; non-ordered: the nearest one. Exact: the
        pre-filter only discards centroids that cannot be within ε; candidates are compared in float64.
        """
        if ys.shape[0] == 1:  # the serving case: a 1-D mat-vec and one exact pass over few candidates
            if hi <= lo:
                return np.full(1, -1, dtype=np.int64)
            v = cls.scores(lo, hi, ys)[0]
            cand = np.flatnonzero(v >= np.float32(_threshold(ys, self.epsilon)[0])) + lo
            return np.full(1, self._exact_one(cls, cand, ys[0]), dtype=np.int64)
        out = np.full(ys.shape[0], -1, dtype=np.int64)
        if hi <= lo:
            return out
        for i in range(0, ys.shape[0], _CHUNK):
            mask = cls.candidates(lo, hi, ys[i:i + _CHUNK], self.epsilon)
            rows, cols = np.nonzero(mask)  # row-major: each query's candidates in insertion order
            if rows.size == 0:
                continue
            cand = cols + lo
            if rows.size > _EXACT_LIMIT:  # many near misses: query by query, bounded memory
                bounds = np.searchsorted(rows, np.arange(mask.shape[0] + 1))
                for r in range(mask.shape[0]):
                    out[i + r] = self._exact_one(cls, cand[bounds[r]:bounds[r + 1]], ys[i + r])
                continue
            d = np.abs(cls.buf[cand] - ys[i + rows]).sum(1)
            within = d <= self.epsilon
            rows, cand, d = rows[within], cand[within], d[within]
            if rows.size == 0:
                continue
            if self.ordered:
                first = np.ones(rows.size, dtype=bool)  # first hit of each row (rows are grouped, cand ascending)
                first[1:] = rows[1:] != rows[:-1]
                out[i + rows[first]] = cand[first]
            else:
                order = np.lexsort((d, rows))  # per row, nearest first (ties: the earlier centroid)
                rows, cand = rows[order], cand[order]
                first = np.ones(rows.size, dtype=bool)
                first[1:] = rows[1:] != rows[:-1]
                out[i + rows[first]] = cand[first]
        return out

    def _exact_one(self, cls: _ClassCentroids, cand: np.ndarray, y: np.ndarray) -> int:
        """The answer for one query among its pre-filter candidates (ascending), or -1."""
        best, best_d = -1, np.inf
        for s in range(0, cand.size, _EXACT_BLOCK):
            blk = cand[s:s + _EXACT_BLOCK]
            d = np.abs(cls.buf[blk] - y).sum(1)
            within = d <= self.epsilon
            if not within.any():
                continue
            if self.ordered:
                return int(blk[int(within.argmax())])  # first hit: stop scanning
            j = int(np.where(within, d, np.inf).argmin())
            if d[j] < best_d:
                best, best_d = int(blk[j]), float(d[j])
        return best

    def _run(self, y: Tensor, frozen: bool) -> Tensor:
        ys = y.numpy()
        b, k = ys.shape
        self._ensure_classes(k)
        tops = ys.argmax(1)
        out = ys.copy()
        for t in (tops if b == 1 else np.unique(tops)):
            rows = np.nonzero(tops == t)[0]  # ascending = arrival order
            cls = self._classes[int(t)]
            n_before = cls.n
            idx = self._match(cls, 0, n_before, ys[rows])
            for r, j in zip(rows, idx, strict=True):
                if j >= 0 and self.ordered:
                    out[r] = cls.centroid(j)  # an existing centroid precedes anything this batch appends
                    continue
                if frozen:
                    # the official frozen quantizer: the first centroid within ε, else the NEAREST centroid of the
                    # class (whatever its distance; an empty class answers y itself). The attacker's table then
                    # drops entries whose distortion exceeds ε (pbayes' max_distortion filter).
                    out[r] = cls.centroid(j) if j >= 0 else self._nearest(cls, ys[r])
                    continue
                # uncovered by the pre-batch centroids (or non-ordered: a newer centroid may be nearer):
                # look at the centroids this batch has appended so far, then append if still uncovered
                jn = self._match(cls, n_before, cls.n, ys[r:r + 1])[0]
                jn = jn - n_before if jn >= 0 else -1
                if self.ordered:
                    if jn < 0:
                        jn = cls.append(ys[r]) - n_before
                        self._order.append((int(t), n_before + jn))
                        self.growth.append((self.queries_seen + int(r) + 1, self.num_centroids))
                    out[r] = cls.centroid(n_before + jn)
                else:
                    cands = [c for c in (j, n_before + jn if jn >= 0 else -1) if c >= 0]
                    if not cands:
                        c = cls.append(ys[r])
                        self._order.append((int(t), c))
                        self.growth.append((self.queries_seen + int(r) + 1, self.num_centroids))
                        cands = [c]
                    dist = [np.abs(cls.centroid(c) - ys[r]).sum() for c in cands]
                    out[r] = cls.centroid(cands[int(np.argmin(dist))])
        if not frozen:
            self.queries_seen += b
        return torch.from_numpy(out)

    @staticmethod
    def _nearest(cls: _ClassCentroids, y: np.ndarray) -> np.ndarray:
        """The class's ℓ1-nearest centroid (earliest on ties), or ``y`` when the class has none."""
        if cls.n == 0:
            return y
        best, best_d = 0, np.inf
        for s in range(0, cls.n, _EXACT_BLOCK * 16):
            d = np.abs(cls.buf[s:min(cls.n, s + _EXACT_BLOCK * 16)] - y).sum(1)
            j = int(d.argmin())
            if d[j] < best_d:
                best, best_d = s + j, float(d[j])
        return cls.centroid(best)

    def _defend(self, y: Tensor, x: Tensor | None) -> Tensor:
        return self._run(y, frozen=False)

    def defend_frozen(self, probs: Tensor, x: Tensor | None = None) -> Tensor:
        if self.num_classes is None:
            return as_probs(probs).to(probs.dtype)
        return self._run(as_probs(probs), frozen=True).to(probs.dtype)

    def params(self) -> dict[str, float | int | str | bool | None]:
        return {"epsilon": self.epsilon, "ordered": self.ordered}
