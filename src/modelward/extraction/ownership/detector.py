"""Per-client extraction detection on the query stream (PRADA: Juuti, Szyller, Marchal & Asokan, "PRADA:
Protecting Against DNN Model Stealing Attacks", EuroS&P 2019, Algorithm 1), calibrated for the streams real users
send and bounded in memory.

PRADA keeps, per client, a *growing set* G_c of past queries per predicted class c. A new query x predicted as c
contributes its minimum ℓ2 distance to G_c, d_min, to the client's distance set D; x joins G_c when d_min exceeds
the class threshold T_c = max(T_c, mean(D_c) − std(D_c)) over the distances D_c that admitted G_c's members.
Natural queries give a D close to a normal; synthetic queries (JBDA and its variants step from earlier queries by
small perturbations) give a spike of small distances. The Shapiro–Wilk statistic W of D below δ flags the client.

What this implementation changes, and why (measured in ``bench/prada_calibration.py``, table in docs/guard.md):

- **log distances.** The test runs on log d_min. Raw distances are right-skewed, and a stream sent grouped by class
  (all of class 0, then class 1, ...) starts each class with a few large distances to a near-empty G_c: the raw
  statistic flagged 7 of 30 natural class-sorted digits streams, the log one none of them at the same power against
  JBDA streams.
- **exact repeats are skipped.** A query equal to a member of G_c (d_min = 0) teaches an extractor nothing new (the
  guard answers it identically) and put a spike at 0 into D: 5 % re-sent queries flagged 2 of 10 streams.
- **a window.** W is computed over the latest ``window`` distances, so D stops growing (Shapiro–Wilk's power grows
  with n: any deviation from normality of a very long natural stream is eventually "significant").
- **persistence, and a flag that clears.** A key is flagged when W < δ in ``consecutive`` successive tests (one
  every ``test_every`` new distances); a transient dip at a class change does not flag. A flag clears after
  ``consecutive`` successive tests with W ≥ δ, or ``clear_after_s`` seconds after it was raised (the window
  then restarts: a key refused under ``action = "refuse"`` sends nothing that could clear it).

State is bounded: at most ``max_members`` stored queries per client (new ones stop joining G once reached), the
window of distances, and a few numbers per class. With ``max_memory_mb`` and a ``loader`` (the guard's store), the
least recently used clients' states are evicted and read back on their next request: memory is capped for any
number of keys.

The detector never changes its state while judging a batch: :meth:`PradaDetector.prepare` returns a
:class:`PradaUpdate` (the batch's new members, distances and verdict) that :meth:`PradaDetector.apply` commits. A
request whose transaction fails simply drops its update: undoing costs nothing, whatever the history.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.stats import shapiro
from torch import Tensor

try:  # the Shapiro–Wilk routine behind scipy.stats.shapiro (AS R94), without its argument-checking wrapper
    from scipy.stats._morestats import swilk as _swilk
except ImportError:  # pragma: no cover - another SciPy layout: the public function
    _swilk = None

from modelward.errors import ConfigError


@dataclass
class ClassStats:
    """PRADA's per-class threshold T_c and the running sums of the distances that admitted G_c's members."""

    threshold: float = 0.0
    n: int = 0
    s: float = 0.0
    ss: float = 0.0

    def admit(self, d: float) -> None:
        self.n += 1
        self.s += d
        self.ss += d * d
        mean = self.s / self.n
        std = math.sqrt(max(0.0, self.ss / self.n - mean * mean))  # population std, as np.std
        self.threshold = max(self.threshold, mean - std)

    def copy(self) -> ClassStats:
        return ClassStats(self.threshold, self.n, self.s, self.ss)


class _Members:
    """One class's growing set: a float32 buffer that doubles as it fills (rows ``[:n]`` are the members), and each
    member's squared norm in float64, computed once when it joins (:func:`_min_dist` needed them on every query)."""

    __slots__ = ("buf", "n", "sq")

    def __init__(self, dim: int) -> None:
        self.buf = np.empty((8, dim), dtype=np.float32)
        self.sq = np.empty(8, dtype=np.float64)
        self.n = 0

    def append(self, rows: np.ndarray) -> None:
        need = self.n + len(rows)
        if need > len(self.buf):
            size = max(need, 2 * len(self.buf))
            grown = np.empty((size, self.buf.shape[1]), dtype=np.float32)
            grown[: self.n] = self.buf[: self.n]
            self.buf = grown
            sq = np.empty(size, dtype=np.float64)
            sq[: self.n] = self.sq[: self.n]
            self.sq = sq
        self.buf[self.n : need] = rows
        r64 = self.buf[self.n : need].astype(np.float64)
        self.sq[self.n : need] = (r64 * r64).sum(1)  # row by row: the same values as over all rows at once
        self.n = need

    @property
    def rows(self) -> np.ndarray:
        return self.buf[: self.n]

    @property
    def norms(self) -> np.ndarray:
        return self.sq[: self.n]

    @property
    def nbytes(self) -> int:
        return self.buf.nbytes + self.sq.nbytes


@dataclass
class KeyState:
    """Everything the detector knows about one client (bounded: members ≤ max_members, distances ≤ window).

    ``nd`` counts the distances ever recorded (the sequence number of the next one); ``window_start`` is the
    first that counts (a cleared flag restarts the window); ``version`` increases with every applied update (the
    guard's store compares it to find a cached state that another replica has changed)."""

    dim: int = 0
    members: dict[int, _Members] = field(default_factory=dict)
    member_seq: int = 0  # members ever stored (all classes)
    stats: dict[int, ClassStats] = field(default_factory=dict)
    window: np.ndarray = field(default_factory=lambda: np.zeros(0))  # log distances, oldest first
    nd: int = 0
    window_start: int = 0
    queries: int = 0
    tested_at: int = 0
    lows: int = 0  # successive tests with W < δ
    highs: int = 0  # successive tests with W ≥ δ
    last_w: float | None = None
    flagged_at: int | None = None
    flag_time: float | None = None
    flags: int = 0  # times flagged (a cleared flag can come back)
    version: int = 0

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.members.values()) + self.window.nbytes + 64 * len(self.stats) + 512

    def member_count(self) -> int:
        return sum(m.n for m in self.members.values())


@dataclass(frozen=True)
class DetectorVerdict:
    """The detector's view of one client.

    Args:
        flagged: flagged now (W < δ in ``consecutive`` successive tests, not cleared since).
        shapiro_w: the latest W (None before ``min_queries`` distances).
        queries: queries observed from this client.
        flagged_at: the query count at which the client was first flagged (kept when a flag clears).
        flag_time: when (Unix time) the current flag was raised (None: not flagged now).
        flags: how many times the client was flagged.
    """

    flagged: bool
    shapiro_w: float | None
    queries: int
    flagged_at: int | None
    flag_time: float | None = None
    flags: int = 0


@dataclass
class PradaUpdate:
    """What one batch changes for one client, not yet applied (:meth:`PradaDetector.apply`).

    ``new_members``: (seq, class, float32 row) of the queries that joined G; ``new_distances``: the log distances
    recorded, their first sequence number is ``base_nd``; ``state``: the client's state after the batch, except
    that members and the window are only described by the two lists (applied in O(batch))."""

    client: str
    base_version: int
    new_members: list[tuple[int, int, np.ndarray]]
    base_nd: int
    new_distances: list[float]
    member_seq: int
    stats: dict[int, ClassStats]
    queries: int
    nd: int
    window_start: int
    tested_at: int
    lows: int
    highs: int
    last_w: float | None
    flagged_at: int | None
    flag_time: float | None
    flags: int
    dim: int
    newly_flagged: bool = False
    cleared: bool = False

    def verdict(self) -> DetectorVerdict:
        return DetectorVerdict(self.flag_time is not None, self.last_w, self.queries, self.flagged_at, self.flag_time,
                               self.flags)


Loader = Callable[[str, "KeyState | None"], "KeyState | None"]


class PradaDetector:
    """PRADA (Algorithm 1) over many clients, with the calibration and bounds of the module docstring.

    Args:
        delta: the Shapiro–Wilk threshold δ on log distances (flag when W < δ in ``consecutive`` tests).
        min_queries: distances in the window needed before testing (PRADA starts at 100).
        max_growing: most stored queries per client (new ones stop joining G once reached).
        window: distances the test looks at (the latest).
        consecutive: successive tests below δ that flag (and at or above δ that clear).
        test_every: new distances between two tests.
        clear_after_s: a flag clears this many seconds after it was raised (None: only by later tests).
        max_memory_mb: cap on the states held in memory (needs ``loader``: evicted states are read back from it).
        loader: ``loader(client, cached)`` returns the client's stored state (None: none stored).

    Returns:
        ``observe(client, x, predicted)`` → (:class:`DetectorVerdict`, the applied :class:`PradaUpdate`);
        ``prepare`` / ``apply`` for callers that commit elsewhere first; ``verdict(client)``.

    Example:
        >>> import torch
        >>> det = PradaDetector(min_queries=20)
        >>> v, _ = det.observe("alice", torch.rand(50, 8), torch.randint(0, 3, (50,)))
        >>> v.queries
        50
    """

    def __init__(self, delta: float = 0.92, min_queries: int = 100, max_growing: int = 2000, window: int = 1000,
                 consecutive: int = 6, test_every: int = 32, clear_after_s: float | None = 3600.0,
                 max_memory_mb: float | None = None, loader: Loader | None = None) -> None:
        if not 0.0 < delta < 1.0:
            raise ConfigError(f"detector delta: must be in (0, 1), got {delta}")
        if min_queries < 3:
            raise ConfigError(f"detector min_queries: must be >= 3 (Shapiro–Wilk), got {min_queries}")
        if window < min_queries:
            raise ConfigError(f"detector window: must be >= min_queries ({min_queries}), got {window}")
        if max_memory_mb is not None and loader is None:
            raise ConfigError("detector max_memory_mb: needs a store to read evicted states back from")
        self.delta, self.min_queries, self.max_growing = float(delta), int(min_queries), int(max_growing)
        self.window, self.consecutive, self.test_every = int(window), max(1, int(consecutive)), max(1, int(test_every))
        self.clear_after_s = clear_after_s
        self.max_bytes = None if max_memory_mb is None else int(max_memory_mb * 2**20)
        self.loader = loader
        self._clients: OrderedDict[str, KeyState] = OrderedDict()  # least recently used first
        self._bytes = 0
        self.evictions = 0

    # ------------------------------------------------------------------------------------------- state
    def clients(self) -> list[str]:
        return sorted(self._clients)

    def cached(self, client: str) -> KeyState | None:
        return self._clients.get(client)

    def memory_bytes(self) -> int:
        return self._bytes

    def state(self, client: str) -> KeyState:
        """The client's state (read back through the loader when it is not in memory, or refreshed when the loader
        finds a newer one)."""
        st = self._clients.get(client)
        if self.loader is not None:
            fresh = self.loader(client, st)
            if fresh is not None and fresh is not st:
                self._put(client, fresh)
                st = fresh
        if st is None:
            st = KeyState()
            self._put(client, st)
        self._clients.move_to_end(client)
        return st

    def _put(self, client: str, st: KeyState) -> None:
        old = self._clients.pop(client, None)
        if old is not None:
            self._bytes -= old.nbytes
        self._clients[client] = st
        self._bytes += st.nbytes
        self._evict(keep=client)

    def _evict(self, keep: str) -> None:
        if self.max_bytes is None:
            return
        while self._bytes > self.max_bytes and len(self._clients) > 1:
            victim = next(iter(self._clients))
            if victim == keep:
                self._clients.move_to_end(victim)
                victim = next(iter(self._clients))
            self._bytes -= self._clients.pop(victim).nbytes
            self.evictions += 1

    def forget(self, client: str) -> None:
        st = self._clients.pop(client, None)
        if st is not None:
            self._bytes -= st.nbytes

    # ------------------------------------------------------------------------------------------- judging
    def prepare(self, client: str, x: Tensor, predicted: Tensor, now: float | None = None) -> PradaUpdate:
        """Judge one batch of a client's queries (in arrival order, with the model's top-1 for each) without
        changing any state; :meth:`apply` commits the result."""
        now = time.time() if now is None else now
        st = self.state(client)
        rows = x.detach().to("cpu", torch.float32).reshape(len(x), -1).numpy()
        preds = [int(c) for c in predicted.tolist()]
        dim = rows.shape[1] if len(rows) else st.dim
        if st.dim and dim != st.dim:
            raise ConfigError(f"detector: client {client!r} sent rows of {dim} values after rows of {st.dim}")
        up = PradaUpdate(client, st.version, [], st.nd, [], st.member_seq, {c: s.copy() for c, s in st.stats.items()},
                         st.queries,
                         st.nd, st.window_start, st.tested_at, st.lows, st.highs, st.last_w, st.flagged_at,
                         st.flag_time, st.flags, dim)
        if (up.flag_time is not None and self.clear_after_s is not None
                and now - up.flag_time >= self.clear_after_s):
            self._clear(up, restart=True)
        # distances to the committed members, one matrix product per class (the batch's own new members are
        # handled in the sequential pass below)
        d_committed = np.full(len(rows), np.inf)
        for c in set(preds):
            m = st.members.get(c)
            if m is None or m.n == 0:
                continue
            idx = [i for i, p in enumerate(preds) if p == c]
            d_committed[idx] = _min_dist(rows[idx], m.rows, m.norms)
        pending: dict[int, list[np.ndarray]] = {}
        total = st.member_count()
        seq = st.member_seq
        window = st.window
        for i, c in enumerate(preds):
            up.queries += 1
            v = rows[i]
            mine = pending.get(c)
            d = d_committed[i]
            if mine:
                d = min(d, float(_min_dist(v[None], np.stack(mine))[0]))
            if math.isinf(d):  # the first query of its class: joins G, no distance
                if total < self.max_growing:
                    pending.setdefault(c, []).append(v)
                    up.new_members.append((seq, c, v.copy()))
                    seq += 1
                    total += 1
                    up.member_seq = seq
                    up.stats.setdefault(c, ClassStats())
                continue
            if d == 0.0:  # an exact repeat of a stored query: nothing new to learn, not a distance
                continue
            up.new_distances.append(math.log(d))
            up.nd += 1
            cs = up.stats.setdefault(c, ClassStats())
            if d > cs.threshold and total < self.max_growing:
                pending.setdefault(c, []).append(v)
                up.new_members.append((seq, c, v.copy()))
                seq += 1
                total += 1
                up.member_seq = seq
                cs.admit(float(d))
            if up.nd - up.tested_at >= self.test_every:
                self._test(up, window, now)
        return up

    def _window_values(self, up: PradaUpdate, committed: np.ndarray) -> np.ndarray:
        lo = max(up.window_start, up.nd - self.window)
        new = np.asarray(up.new_distances[max(0, lo - up.base_nd):], dtype=np.float64)
        keep_old = max(0, up.base_nd - lo)
        old = committed[len(committed) - keep_old:] if keep_old else committed[:0]
        return np.concatenate([old, new])

    def _test(self, up: PradaUpdate, committed: np.ndarray, now: float) -> None:
        up.tested_at = up.nd
        d = self._window_values(up, committed)
        if len(d) < self.min_queries:
            return
        w = 1.0 if np.ptp(d) == 0 else shapiro_w(d)
        up.last_w = w
        if w < self.delta:
            up.lows, up.highs = up.lows + 1, 0
        else:
            up.lows, up.highs = 0, up.highs + 1
        if up.flag_time is None and up.lows >= self.consecutive:
            up.flag_time, up.flags = now, up.flags + 1
            up.flagged_at = up.queries if up.flagged_at is None else up.flagged_at
            up.newly_flagged = True
        elif up.flag_time is not None and up.highs >= self.consecutive:
            self._clear(up, restart=False)

    @staticmethod
    def _clear(up: PradaUpdate, restart: bool) -> None:
        up.flag_time, up.cleared, up.lows, up.highs = None, True, 0, 0
        if restart:  # the window restarts: the distances before the flag no longer count
            up.window_start = up.nd

    def apply(self, up: PradaUpdate) -> DetectorVerdict:
        """Commit a prepared update (after the store committed its rows). An update prepared against an older state
        of the client (another batch was applied in between) is refused: prepare again."""
        st = self._clients.get(up.client)
        if st is None:  # only a first batch can find no state (states are not evicted between prepare and apply)
            st = KeyState()
            self._put(up.client, st)
        if st.version != up.base_version:
            raise RuntimeError(f"detector: stale update for {up.client!r} (state {st.version}, update "
                               f"{up.base_version})")
        before = st.nbytes
        st.dim = st.dim or up.dim
        for _, c, v in up.new_members:
            m = st.members.get(c)
            if m is None:
                m = st.members[c] = _Members(st.dim)
            m.append(v[None])
        st.member_seq = up.member_seq
        st.stats = up.stats
        lo = max(up.window_start, up.nd - self.window)
        st.window = self._window_values(up, st.window)
        assert len(st.window) == up.nd - lo
        st.nd, st.window_start = up.nd, up.window_start
        st.queries, st.tested_at, st.lows, st.highs = up.queries, up.tested_at, up.lows, up.highs
        st.last_w, st.flagged_at, st.flag_time, st.flags = up.last_w, up.flagged_at, up.flag_time, up.flags
        st.version += 1
        self._bytes += st.nbytes - before
        self._clients.move_to_end(up.client)
        self._evict(keep=up.client)
        return self.verdict(up.client)

    def observe(self, client: str, x: Tensor, predicted: Tensor,
                now: float | None = None) -> tuple[DetectorVerdict, PradaUpdate]:
        """Judge one batch and apply it at once (no store): the verdict after it and the update."""
        up = self.prepare(client, x, predicted, now)
        return self.apply(up), up

    def verdict(self, client: str) -> DetectorVerdict:
        st = self._clients.get(client) or KeyState()
        return DetectorVerdict(st.flag_time is not None, st.last_w, st.queries, st.flagged_at, st.flag_time, st.flags)


def _shapiro_w_direct(x: np.ndarray) -> float:
    """``scipy.stats.shapiro(x).statistic`` computed as SciPy computes it (sorted, shifted by ``x[N // 2]``, AS R94),
    without the wrapper that checks axes, NaN policy and masked arrays (~4× the routine itself on 1,000 values)."""
    x = np.ravel(x).astype(np.float64)
    y = np.sort(x)
    y -= x[len(x) // 2]
    w, _pw, _ifault = _swilk(y, np.zeros(len(x) // 2, dtype=np.float64), 0)
    return float(w)


def _same_as_scipy() -> bool:
    """Whether :func:`_shapiro_w_direct` gives SciPy's statistic bit for bit (checked once, on import)."""
    if _swilk is None:
        return False
    rng = np.random.default_rng(0)
    try:
        return all(_shapiro_w_direct(x) == float(shapiro(x).statistic)
                   for x in (rng.normal(size=101), np.log(rng.random(1000) + 1e-3), rng.random(37)))
    except Exception:  # noqa: BLE001 - any difference in the private routine's interface: use the public one
        return False


def shapiro_w(x: np.ndarray) -> float:
    """The Shapiro–Wilk statistic W of ``x`` (≥ 3 values), equal to ``scipy.stats.shapiro(x).statistic``.

    Example:
        >>> round(shapiro_w(np.array([1.0, 2.0, 4.0, 8.0])), 4)
        0.9202
    """
    return _shapiro_w_direct(x) if _FAST_SHAPIRO else float(shapiro(x).statistic)


_FAST_SHAPIRO = _same_as_scipy()


def _min_dist(a: np.ndarray, b: np.ndarray, b_sq: np.ndarray | None = None) -> np.ndarray:
    """Row-wise minimum ℓ2 distance from each row of ``a`` to the rows of ``b``: the nearest row is found with one
    matrix product (float64), and its distance recomputed exactly, so an exact repeat gives exactly 0. ``b_sq``:
    the rows' squared norms in float64 if known (:class:`_Members` keeps them)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if b_sq is None:
        b_sq = (b64 * b64).sum(1)
    d2 = (a64 * a64).sum(1)[:, None] - 2.0 * a64 @ b64.T + b_sq[None, :]
    j = d2.argmin(1)
    return np.sqrt(((a64 - b64[j]) ** 2).sum(1))
