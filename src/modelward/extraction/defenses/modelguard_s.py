"""ModelGuard-S (ModelGuard paper, Sec. 3.4, Algorithm 1: ordered incremental prediction quantization).

Per top-1 class t an ordered list of centroids C_t. For each query's clean prediction y (top-1 t):

    if C_t is empty or min_{c ∈ C_t} ‖c − y‖₁ > ε:  append y to the END of C_t
    return the FIRST centroid (insertion order) of C_t within ℓ1 distance ε of y

Every answer is an earlier clean prediction with the same top-1, so ℓ1 ≤ ε, the top-1 label and the simplex hold
exactly; centroids are only appended, so once y is covered its answer never changes (no leakage through
inconsistency, Eq. 17–18). ``ordered=False`` is the *non-ordered* variant of the Table 6 ablation: the nearest
centroid within ε instead of the first, which can change an old answer when a closer centroid appears.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from modelward.errors import ConfigError, DataError
from modelward.extraction.defenses.base import PredictionDefense

_CHUNK_ELEMS = 1 << 20  # bound on the B×N distance block evaluated at once (8 MiB of float64)
_BLOCK = 4096  # centroids per block in the single-query early-exit scan


class _ClassCentroids:
    """One class's ordered centroid list in a growable, class-major float64 buffer (K × capacity).

    Class-major so that an ℓ1 scan is K vector passes over contiguous rows (≈ 10× faster than reducing the
    short rows of an N × K array).
    """

    def __init__(self, k: int) -> None:
        self.buf = np.empty((k, 16))
        self.n = 0

    @property
    def cols(self) -> np.ndarray:
        return self.buf[:, : self.n]

    def centroid(self, i: int) -> np.ndarray:
        return self.buf[:, i]

    def append(self, y: np.ndarray) -> int:
        if self.n == self.buf.shape[1]:
            grown = np.empty((self.buf.shape[0], 2 * self.n))
            grown[:, : self.n] = self.buf[:, : self.n]
            self.buf = grown
        self.buf[:, self.n] = y
        self.n += 1
        return self.n - 1


class ModelGuardS(PredictionDefense):
    """Algorithm 1 with ℓ1 radius ``epsilon``; stateful (centroids), deterministic for repeated queries.

    Queries inside a batch are processed in arrival order, exactly as if sent one by one. ``defend_frozen`` answers
    without adding centroids (the attacker's offline copy; an uncovered y is answered with itself). The state
    (centroids in global insertion order with their classes) round-trips through :meth:`state_dict` /
    :meth:`load_state_dict` and :meth:`save` / :meth:`load` (safetensors).
    """

    name = "modelguard_s"
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

    def save(self, path: str | Path) -> None:
        from modelward.core.io import save_tensors

        save_tensors(path, self.state_dict(), {"defense": self.name, "epsilon": repr(self.epsilon)})

    def load(self, path: str | Path) -> None:
        from modelward.core.io import load_tensors

        self.load_state_dict(load_tensors(path))

    # ---------------------------------------------------------------- lookup
    def _distances(self, cols: np.ndarray, ys: np.ndarray) -> np.ndarray:
        """ℓ1 distances (len(ys) × n) between query rows and class-major centroids ``cols`` (K × n)."""
        acc = np.abs(cols[0][None, :] - ys[:, 0][:, None])
        for j in range(1, cols.shape[0]):
            acc += np.abs(cols[j][None, :] - ys[:, j][:, None])
        return acc

    def _match(self, cols: np.ndarray, ys: np.ndarray) -> np.ndarray:
        """For each row of ``ys``, the index of its answer among ``cols`` (first or nearest within ε), or -1."""
        out = np.full(ys.shape[0], -1, dtype=np.int64)
        n = cols.shape[1]
        if n == 0:
            return out
        if self.ordered:
            # query by query: scan in blocks and stop at the first block with a hit (covered queries hit early;
            # a B × N block would be memory-bound and slower than B early-exit scans)
            for r in range(ys.shape[0]):
                for lo in range(0, n, _BLOCK):
                    within = self._distances(cols[:, lo:lo + _BLOCK], ys[r:r + 1])[0] <= self.epsilon
                    if within.any():
                        out[r] = lo + int(within.argmax())
                        break
            return out
        step = max(1, _CHUNK_ELEMS // n)
        for i in range(0, ys.shape[0], step):
            d = self._distances(cols, ys[i:i + step])
            within = d <= self.epsilon
            hit = within.any(1)
            idx = np.where(within, d, np.inf).argmin(1)  # non-ordered: the nearest centroid
            out[i:i + step] = np.where(hit, idx, -1)
        return out

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
            idx = self._match(cls.cols, ys[rows])
            for r, j in zip(rows, idx, strict=True):
                if j >= 0 and self.ordered:
                    out[r] = cls.centroid(j)  # an existing centroid precedes anything this batch appends
                    continue
                if frozen:
                    out[r] = cls.centroid(j) if j >= 0 else ys[r]
                    continue
                # uncovered by the pre-batch centroids (or non-ordered: a newer centroid may be nearer):
                # look at the centroids this batch has appended so far, then append if still uncovered
                new = cls.cols[:, n_before:]
                jn = self._match(new, ys[r:r + 1])[0]
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

    def _defend(self, y: Tensor, x: Tensor | None) -> Tensor:
        return self._run(y, frozen=False)

    def defend_frozen(self, probs: Tensor, x: Tensor | None = None) -> Tensor:
        from modelward.extraction.defenses.base import as_probs

        if self.num_classes is None:
            return as_probs(probs).to(probs.dtype)
        return self._run(as_probs(probs), frozen=True).to(probs.dtype)

    def params(self) -> dict[str, float | int | str | bool | None]:
        return {"epsilon": self.epsilon, "ordered": self.ordered}
