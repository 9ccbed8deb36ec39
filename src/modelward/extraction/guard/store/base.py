"""The guard's store: one interface (:class:`Store`) over SQL, with two dialects — the embedded SQLite default
(:mod:`.sqlite`) and PostgreSQL for replicas sharing one state (:mod:`.postgres`).

What it holds: per-key usage (budgets), the query log, operator keys, ModelGuard-S centroid rows, the watermark's
marked rows, the PRADA detector's bounded state per key, and settings every replica must share (``meta``).

Every answered request is one transaction (:meth:`SQLStore.transaction`): its charge, its new centroids, marks and
detector rows and its log row commit together or not at all. Nothing on a request's path reads or writes more than
O(its own rows + one key's bounded detector state): no history is replayed, on success or on error.

Storage only: a request the budget cannot pay for raises :class:`~modelward.extraction.guard.errors.BudgetExceeded`
(the service answers it as 429); a store locked longer than ``busy_timeout`` raises :class:`StoreBusy` (503);
nothing here knows about HTTP.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from modelward.errors import ConfigError
from modelward.extraction.guard.errors import BudgetExceeded, GuardError, WouldBlock
from modelward.extraction.guard.store.migrations import LATEST, MIGRATIONS
from modelward.extraction.ownership.detector import ClassStats, KeyState, PradaUpdate, _Members

log = logging.getLogger("modelward.guard")


def key_digest(key: str) -> str:
    """The SHA-256 (hex) under which an operator-added API key is stored."""
    return hashlib.sha256(key.encode()).hexdigest()


class StoreBusy(GuardError):
    """The store stayed locked by another connection for longer than the busy timeout; nothing was changed."""

    def __init__(self, timeout: float, rows: int = 0) -> None:
        super().__init__("store_busy", f"the guard's store is locked by another process for more than {timeout:g} s; "
                         "nothing was charged; retry later", rows)


@dataclass(frozen=True)
class StoredKey:
    """An API key row of the store: added by an operator (``key_sha256`` set) or a revocation of a config key."""

    name: str
    key_sha256: str | None
    budget: int | None
    revoked: bool


class Dialect(Protocol):
    """What differs between the SQL databases (types, transactions, locks, errors)."""

    name: str
    types: dict[str, str]
    row_locks: bool  # True: concurrent writers exist (replicas): lock the rows a request reads before it writes

    def sql(self, stmt: str) -> str: ...

    def begin(self, db: Any, wait: bool) -> None: ...

    def is_busy(self, e: BaseException) -> bool: ...

    def blob(self, b: bytes) -> Any: ...

    def tables(self, txn: Transaction) -> set[str]: ...

    def columns(self, txn: Transaction, table: str) -> set[str]: ...

    def migration_lock(self, txn: Transaction) -> None: ...

    def set_busy_timeout(self, db: Any, seconds: float) -> None: ...


class Transaction:
    """The writes of one request inside :meth:`SQLStore.transaction` (all of them commit, or none)."""

    def __init__(self, store: SQLStore) -> None:
        self.store = store

    # -- SQL ------------------------------------------------------------------------------------------------
    def execute(self, stmt: str, args: Sequence[Any] = ()) -> Any:
        return self.store.db.execute(self.store.dialect.sql(stmt), tuple(args))

    def executemany(self, stmt: str, rows: list[Sequence[Any]]) -> None:
        if rows:
            self.store._executemany(self.store.dialect.sql(stmt), rows)

    # -- budgets ----------------------------------------------------------------------------------------------
    def charge(self, key_name: str, rows: int, budget: int | None) -> None:
        """Add ``rows`` to the key's usage, or raise BudgetExceeded when ``used + rows > budget``.

        One conditional UPDATE: atomic in SQLite, and in PostgreSQL a concurrent UPDATE of the same row waits and
        re-checks the condition on the committed value (READ COMMITTED), so replicas never over-spend a key."""
        self.execute("INSERT INTO usage(key_name, used) VALUES(?, 0) ON CONFLICT (key_name) DO NOTHING", (key_name,))
        if budget is None:
            self.execute("UPDATE usage SET used = used + ? WHERE key_name = ?", (rows, key_name))
            return
        cur = self.execute("UPDATE usage SET used = used + ? WHERE key_name = ? AND used + ? <= ?",
                           (rows, key_name, rows, budget))
        if cur.rowcount != 1:
            used = int(self.execute("SELECT used FROM usage WHERE key_name = ?", (key_name,)).fetchone()[0])
            raise BudgetExceeded(key_name, used, budget, rows)

    # -- centroids --------------------------------------------------------------------------------------------
    def append_centroids(self, table: str, start: int, labels: np.ndarray, vectors: np.ndarray) -> None:
        """Persist centroids ``start, start + 1, ...`` (float64 bytes)."""
        blob = self.store.dialect.blob
        rows = [(start + i, int(c), blob(np.ascontiguousarray(v, dtype="<f8").tobytes()))
                for i, (c, v) in enumerate(zip(labels, vectors, strict=True))]
        self.executemany(f"INSERT INTO {table}(seq, label, vec) VALUES(?,?,?)", rows)

    def sync_centroids(self, table: str, have: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Centroids other replicas committed after the first ``have`` (a shared store): the table is locked for
        this transaction, so the defense state this request reads and extends is the newest, in one global order.
        A store with one writer (SQLite) returns nothing."""
        if not self.store.dialect.row_locks:
            return np.zeros(0, dtype=np.int64), np.zeros((0, k))
        self.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")
        rows = self.execute(f"SELECT seq, label, vec FROM {table} WHERE seq >= ? ORDER BY seq", (have,)).fetchall()
        if [r[0] for r in rows] != list(range(have, have + len(rows))):
            raise RuntimeError(f"{table}: centroid rows after {have} are not contiguous")
        labels = np.array([r[1] for r in rows], dtype=np.int64)
        vecs = np.stack([np.frombuffer(bytes(r[2]), dtype="<f8") for r in rows]) if rows else np.zeros((0, k))
        return labels, vecs

    # -- log ----------------------------------------------------------------------------------------------------
    def log(self, key_name: str | None, rows: int, status: int, code: str, max_l1: float | None, ms: float,
            request_id: str | None = None) -> None:
        self.store._insert_log(self, key_name, rows, status, code, max_l1, ms, request_id)

    # -- ownership ---------------------------------------------------------------------------------------------
    def insert_marks(self, rows: list[tuple[Any, ...]]) -> None:
        """Marked rows (digest, key, time, shape, x, mark, top1); a row marked before is kept once."""
        blob = self.store.dialect.blob
        self.executemany("INSERT INTO marks(digest, key, time, shape, x, mark, top1) VALUES (?, ?, ?, ?, ?, ?, ?) "
                         "ON CONFLICT (digest) DO NOTHING",
                         [(blob(r[0]), r[1], r[2], r[3], blob(r[4]), r[5], r[6]) for r in rows])

    def detector_state(self, key: str, cached: KeyState | None) -> KeyState | None:
        """The key's detector state as committed: ``cached`` itself when it is current (same version), else read
        (members incrementally from ``cached`` when it is a prefix of the stored ones; the window in full — both
        bounded). A shared store locks the key's row for this transaction. None: nothing stored for the key."""
        if self.store.dialect.row_locks:
            self.execute("INSERT INTO prada_state(key, version) VALUES (?, 0) ON CONFLICT (key) DO NOTHING", (key,))
            row = self.execute(f"SELECT {_STATE_COLS} FROM prada_state WHERE key = ? FOR UPDATE", (key,)).fetchone()
        else:
            row = self.execute(f"SELECT {_STATE_COLS} FROM prada_state WHERE key = ?", (key,)).fetchone()
        if row is None or int(row[0]) == 0:
            return None
        version = int(row[0])
        if cached is not None and cached.version == version:
            return cached
        (_, dim, member_seq, nd, window_start, queries, tested_at, lows, highs, last_w, flagged_at, flag_time, flags,
         stats, _updated) = row
        st = KeyState()
        st.dim = int(dim or 0)
        start = 0
        if cached is not None and cached.dim == st.dim and cached.member_seq <= int(member_seq or 0):
            st.members = {c: _copy_members(m) for c, m in cached.members.items()}
            start = cached.member_seq
        for _seq, cls, vec in self.execute("SELECT seq, cls, vec FROM prada_members WHERE key = ? AND seq >= ? "
                                           "ORDER BY seq", (key, start)).fetchall():
            m = st.members.get(int(cls))
            if m is None:
                m = st.members[int(cls)] = _Members(st.dim)
            m.append(np.frombuffer(bytes(vec), dtype="<f4")[None])
        st.member_seq = int(member_seq or 0)
        st.nd, st.window_start = int(nd or 0), int(window_start or 0)
        lo = max(st.window_start, st.nd - self.store.detector_window)
        d = self.execute("SELECT seq, d FROM prada_dist WHERE key = ? AND seq >= ? ORDER BY seq", (key, lo)).fetchall()
        st.window = np.array([r[1] for r in d], dtype=np.float64)
        st.stats = {int(c): ClassStats(*v) for c, v in json.loads(stats or "{}").items()}
        st.queries, st.tested_at, st.lows, st.highs = int(queries or 0), int(tested_at or 0), int(lows or 0), \
            int(highs or 0)
        st.last_w = None if last_w is None else float(last_w)
        st.flagged_at = None if flagged_at is None else int(flagged_at)
        st.flag_time = None if flag_time is None else float(flag_time)
        st.flags, st.version = int(flags or 0), version
        return st

    def write_detector(self, up: PradaUpdate, window: int) -> None:
        """Persist a prepared detector update: the key's state row, its new members and distances; distances that
        left the window are deleted (the key's rows stay bounded)."""
        stats = json.dumps({str(c): [s.threshold, s.n, s.s, s.ss] for c, s in sorted(up.stats.items())})
        self.execute(
            "INSERT INTO prada_state(key, version, dim, member_seq, nd, window_start, queries, tested_at, lows, highs, "
            "last_w, flagged_at, flag_time, flags, stats, updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (key) DO UPDATE SET version = excluded.version, dim = excluded.dim, "
            "member_seq = excluded.member_seq, nd = excluded.nd, window_start = excluded.window_start, "
            "queries = excluded.queries, tested_at = excluded.tested_at, lows = excluded.lows, highs = excluded.highs, "
            "last_w = excluded.last_w, flagged_at = excluded.flagged_at, flag_time = excluded.flag_time, "
            "flags = excluded.flags, stats = excluded.stats, updated = excluded.updated",
            (up.client, up.base_version + 1, up.dim, up.member_seq, up.nd, up.window_start, up.queries,
             up.tested_at, up.lows, up.highs, up.last_w, up.flagged_at, up.flag_time, up.flags, stats,
             self.store.clock()))
        blob = self.store.dialect.blob
        self.executemany("INSERT INTO prada_members(key, seq, cls, vec) VALUES (?, ?, ?, ?)",
                         [(up.client, s, c, blob(v.astype("<f4").tobytes())) for s, c, v in up.new_members])
        self.executemany("INSERT INTO prada_dist(key, seq, d) VALUES (?, ?, ?)",
                         [(up.client, up.base_nd + i, d) for i, d in enumerate(up.new_distances)])
        lo = max(up.window_start, up.nd - window)
        if up.new_distances or up.window_start > up.base_nd:
            self.execute("DELETE FROM prada_dist WHERE key = ? AND seq < ?", (up.client, lo))
        if up.newly_flagged:
            self.execute("INSERT INTO prada_flags(key, flagged_at, shapiro_w, time) VALUES (?, ?, ?, ?) "
                         "ON CONFLICT (key) DO UPDATE SET flagged_at = excluded.flagged_at, "
                         "shapiro_w = excluded.shapiro_w, time = excluded.time",
                         (up.client, up.queries, up.last_w, up.flag_time))


_STATE_COLS = ("version, dim, member_seq, nd, window_start, queries, tested_at, lows, highs, last_w, flagged_at, "
               "flag_time, flags, stats, updated")


def _copy_members(m: _Members) -> _Members:
    out = _Members(m.buf.shape[1])
    out.append(m.rows)
    return out


class SQLStore:
    """The guard's store over one SQL connection (SQLite or PostgreSQL, see the subclasses).

    Budgets are charged with one conditional ``UPDATE`` in the request's transaction, so concurrent requests — also
    from other processes or replicas — never over-spend a key. Retention counts *serving time* (a clock that
    advances only while a guard runs, continued from the newest log row on start): a wall-clock jump or a long
    shutdown never expires rows early.

    Args:
        busy_timeout: seconds a statement waits for another connection's lock, then :class:`StoreBusy`.
        retention_days: log rows, and detector states of keys unseen, older than this many days of serving time are
            deleted (checked on open and every 10,000 log rows); None = keep.
        max_rows: keep at most this many log rows (the oldest go first); None = no cap.
        detector_window: the detector's window (distances beyond it are not read back).

    Example:
        >>> store = open_store(Path(tmp) / "queries.sqlite")  # doctest: +SKIP
        >>> with store.transaction() as txn:  # doctest: +SKIP
        ...     txn.charge("alice", 16, budget=100)
        >>> store.used("alice")  # doctest: +SKIP
        16
    """

    PRUNE_EVERY = 10_000
    MAX_DEFERRED_LOG_ROWS = 10_000
    dialect: Dialect
    db: Any
    shared = False  # True: replicas may share this store (PostgreSQL)
    where = ""

    def _setup(self, busy_timeout: float, retention_days: float | None, max_rows: int | None,
               detector_window: int) -> None:
        self.busy_timeout = busy_timeout
        self.retention_days, self.max_rows, self.detector_window = retention_days, max_rows, detector_window
        self._lock = threading.RLock()
        self._since_prune = 0
        self._deferred: list[tuple[Any, ...]] = []  # log rows of refused requests written while the store was busy
        self._dropped = 0
        self._clock_base, self._clock_mono = time.time(), time.monotonic()  # provisional, for the migrations
        self._migrate()
        with self._lock:
            newest = self.db.execute(self.dialect.sql("SELECT MAX(svc_time) FROM queries")).fetchone()[0]
        self._clock_base = float(newest) if newest is not None else time.time()
        self._clock_mono = time.monotonic()
        self.prune()

    def _executemany(self, stmt: str, rows: list[Sequence[Any]]) -> None:
        self.db.executemany(stmt, rows)

    # ------------------------------------------------------------------ schema
    def _migrate(self) -> None:
        with self.transaction() as txn:
            self.dialect.migration_lock(txn)
            txn.execute("CREATE TABLE IF NOT EXISTS schema_version (version {int} NOT NULL, applied {real})"
                        .format(**self.dialect.types))
            row = txn.execute("SELECT MAX(version) FROM schema_version").fetchone()
            have = int(row[0]) if row and row[0] is not None else 0
            if have > LATEST:
                raise ConfigError(f"{self.where}: the guard's store has schema version {have}, newer than this "
                                  f"modelward knows ({LATEST}); use the newer modelward, or another store")
            for m in MIGRATIONS:
                if m.version <= have:
                    continue
                for step in m.steps:
                    if isinstance(step, str):
                        txn.execute(step.format(**self.dialect.types))
                    else:
                        step(txn)
                txn.execute("INSERT INTO schema_version(version, applied) VALUES (?, ?)", (m.version, time.time()))
                if have:
                    log.info("guard store %s: migrated to schema %d (%s)", self.where, m.version, m.what)

    def schema_version(self) -> int:
        with self._lock:
            return int(self.db.execute(self.dialect.sql("SELECT MAX(version) FROM schema_version")).fetchone()[0])

    # ------------------------------------------------------------------ clock
    def clock(self) -> float:
        """Serving time in seconds (see the class docstring): never jumps with the wall clock."""
        return self._clock_base + (time.monotonic() - self._clock_mono)

    # ------------------------------------------------------------------ transactions
    @contextmanager
    def transaction(self, wait: bool = True) -> Iterator[Transaction]:
        """One write transaction: committed when the block ends, rolled back if it raises.

        Holds this store's lock for the whole block, so the writes of two requests never interleave. ``wait=False``:
        raise WouldBlock at once (nothing written) when another thread or process holds the lock, instead of
        waiting up to the busy timeout (a shared store always raises it: its calls go over the network).
        """
        if not self._lock.acquire(blocking=wait):
            raise WouldBlock
        try:
            try:
                self.dialect.begin(self.db, wait)
            except WouldBlock:
                raise
            except Exception as e:
                if self.dialect.is_busy(e):
                    raise StoreBusy(self.busy_timeout) from None
                raise
            txn = Transaction(self)
            flushed: list[tuple[Any, ...]] = []
            try:
                flushed = self._flush_deferred(txn)
                yield txn
                self.db.execute("COMMIT")
            except BaseException as e:
                self._rollback()
                self._deferred[:0] = flushed  # not written after all: kept for the next transaction
                if self.dialect.is_busy(e):
                    raise StoreBusy(self.busy_timeout) from None
                raise
        finally:
            self._lock.release()

    def _rollback(self) -> None:
        try:
            self.db.execute("ROLLBACK")
        except Exception:  # noqa: BLE001 - the transaction is already gone (SQLite rolls back on a full disk)
            pass

    # ------------------------------------------------------------------ budgets
    def used(self, key_name: str) -> int:
        with self._lock:
            row = self.db.execute(self.dialect.sql("SELECT used FROM usage WHERE key_name = ?"), (key_name,)).fetchone()
        return int(row[0]) if row else 0

    def used_nowait(self, key_name: str) -> int | None:
        """The key's usage now, without waiting for any lock (None: it cannot be read without waiting)."""
        return None

    def reserve(self, key_name: str, rows: int, budget: int | None) -> None:
        """Charge ``rows`` to the key atomically, or raise BudgetExceeded (nothing charged) when it would overspend."""
        with self.transaction() as txn:
            txn.charge(key_name, rows, budget)

    def reset_usage(self, key_name: str, used: int = 0) -> None:
        with self.transaction() as txn:
            txn.execute("INSERT INTO usage(key_name, used) VALUES(?, ?) ON CONFLICT (key_name) DO UPDATE SET "
                        "used = excluded.used", (key_name, used))

    def usage(self) -> dict[str, int]:
        with self._lock:
            return {k: int(u) for k, u in self.db.execute(self.dialect.sql("SELECT key_name, used FROM usage"))}

    # ------------------------------------------------------------------ operator keys
    def stored_keys(self) -> list[StoredKey]:
        with self._lock:
            rows = self.db.execute(self.dialect.sql(
                "SELECT name, key_sha256, budget, revoked FROM api_keys ORDER BY name")).fetchall()
        return [StoredKey(n, h, None if b is None else int(b), bool(r)) for n, h, b, r in rows]

    def add_key(self, name: str, key: str, budget: int | None) -> None:
        with self.transaction() as txn:
            txn.execute("INSERT INTO api_keys(name, key_sha256, budget, revoked, created) VALUES(?,?,?,0,?)",
                        (name, key_digest(key), budget, time.time()))

    def revoke_key(self, name: str) -> None:
        with self.transaction() as txn:
            txn.execute("INSERT INTO api_keys(name, revoked, created) VALUES(?, 1, ?) ON CONFLICT (name) DO "
                        "UPDATE SET revoked = 1", (name, time.time()))

    # ------------------------------------------------------------------ settings every replica shares
    def pin(self, key: str, value: str) -> str | None:
        """Record ``value`` under ``key`` unless one is recorded; returns the recorded one (None: it was not)."""
        with self.transaction() as txn:
            row = txn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
            if row is None:
                txn.execute("INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING", (key, value))
                return None
            return str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        with self.transaction() as txn:
            txn.execute("INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET "
                        "value = excluded.value", (key, value))

    # ------------------------------------------------------------------ centroids
    def _ensure_table(self, txn: Transaction, table: str) -> None:
        txn.execute(f"CREATE TABLE IF NOT EXISTS {table} (seq {self.dialect.types['int']} PRIMARY KEY, "
                    f"label {self.dialect.types['int']}, vec {self.dialect.types['blob']})")

    def append_centroids(self, table: str, start: int, labels: np.ndarray, vectors: np.ndarray) -> None:
        """Persist centroids ``start, start + 1, ...`` in one transaction."""
        with self.transaction() as txn:
            self._ensure_table(txn, table)
            txn.append_centroids(table, start, labels, vectors)

    def centroids_from(self, table: str, start: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Centroids with index >= ``start`` in order.

        A gap in the sequence (left by an older version whose append failed after the answer) is repaired, not
        refused: the rows are renumbered in order, so later appends continue the sequence, and a warning says how
        many were missing. Rows that are not K float64 values are dropped the same way.
        """
        with self.transaction() as txn:
            self._ensure_table(txn, table)
            rows = [(r[0], r[1], bytes(r[2]) if r[2] is not None else None)
                    for r in txn.execute(f"SELECT seq, label, vec FROM {table} ORDER BY seq").fetchall()]
            good = [r for r in rows if isinstance(r[2], bytes) and len(r[2]) == 8 * k and 0 <= int(r[1]) < k]
            if [r[0] for r in good] != list(range(len(good))):
                missing = (rows[-1][0] + 1 if rows else 0) - len(good)
                log.warning("%s: %d centroid row(s) missing or damaged (a failed write of an older version); "
                            "renumbering the %d others in order", table, missing, len(good))
                txn.execute(f"DELETE FROM {table}")
                txn.executemany(f"INSERT INTO {table}(seq, label, vec) VALUES(?,?,?)",
                                [(i, r[1], self.dialect.blob(r[2])) for i, r in enumerate(good)])
        tail = good[start:]
        labels = np.array([r[1] for r in tail], dtype=np.int64)
        vecs = np.stack([np.frombuffer(r[2], dtype="<f8") for r in tail]) if tail else np.zeros((0, k))
        return labels, vecs

    def rewrite_centroids(self, table: str, labels: np.ndarray, vectors: np.ndarray) -> None:
        """Replace every centroid row by ``labels`` / ``vectors`` (seq 0, 1, ...), in one transaction."""
        with self.transaction() as txn:
            self._ensure_table(txn, table)
            txn.execute(f"DELETE FROM {table}")
            txn.append_centroids(table, 0, labels, vectors)

    def clear_centroids(self, table: str) -> None:
        with self.transaction() as txn:
            txn.execute(f"DROP TABLE IF EXISTS {table}")

    # ------------------------------------------------------------------ ownership (reads)
    def marks(self) -> list[tuple[str, bytes, int, int]]:
        """The watermark's marked rows (shape, x bytes, mark, top1) in the order they were recorded."""
        with self._lock:
            rows = self.db.execute(self.dialect.sql("SELECT shape, x, mark, top1 FROM marks ORDER BY time, digest"))
            return [(r[0], bytes(r[1]), int(r[2]), int(r[3])) for r in rows.fetchall()]

    def marked_rows(self) -> int:
        with self._lock:
            return int(self.db.execute(self.dialect.sql("SELECT COUNT(*) FROM marks")).fetchone()[0])

    def detector_rows(self) -> dict[str, int]:
        """How many rows the detector keeps in the store (states, members, distances): bounded per key."""
        with self._lock:
            return {t: int(self.db.execute(self.dialect.sql(f"SELECT COUNT(*) FROM {t}")).fetchone()[0])
                    for t in ("prada_state", "prada_members", "prada_dist")}

    def detector_summary(self) -> list[tuple[str, int, float | None, bool, int | None, int]]:
        """(key, queries, latest W, flagged now, first flagged at, times flagged) for every key with a state."""
        with self._lock:
            rows = self.db.execute(self.dialect.sql(
                "SELECT key, queries, last_w, flag_time, flagged_at, flags FROM prada_state WHERE version > 0 "
                "ORDER BY key")).fetchall()
        return [(k, int(q or 0), w, t is not None, None if f is None else int(f), int(n or 0))
                for k, q, w, t, f, n in rows]

    def load_detector_state(self, key: str, cached: KeyState | None = None) -> KeyState | None:
        """The key's committed detector state (for readers outside a request: status, tests)."""
        with self.transaction() as txn:
            return txn.detector_state(key, cached)

    # ------------------------------------------------------------------ log
    def _insert_log(self, txn: Transaction, key_name: str | None, rows: int, status: int, code: str,
                    max_l1: float | None, ms: float, request_id: str | None) -> None:
        txn.execute("INSERT INTO queries(ts, svc_time, key_name, rows, status, code, max_l1, ms, request_id) "
                    "VALUES(?,?,?,?,?,?,?,?,?)",
                    (time.time(), self.clock(), key_name, rows, status, code, max_l1, ms, request_id))
        self._since_prune += 1

    def log(self, key_name: str | None, rows: int, status: int, code: str, max_l1: float | None, ms: float,
            request_id: str | None = None, wait: bool = True) -> None:
        """Log a request that changed nothing else (refused, or failed before it was charged).

        It waits for the store at most a short while: a store locked by another process (the refusal being logged
        may be its ``store_busy``) keeps the row in memory, and the next transaction writes it — the answer is
        never held back by its own log row. ``wait=False`` (the event loop, issue 37: a refusal costs one
        committed INSERT, no thread hop): raise WouldBlock, nothing written, when this store's lock or the
        database's write lock is taken, or the store is shared (its calls go over the network)."""
        row = (time.time(), self.clock(), key_name, rows, status, code, max_l1, ms, request_id)
        if not wait:
            with self.transaction(wait=False) as txn:  # WouldBlock before any write when anything holds a lock
                txn.execute(_LOG_INSERT, row)
                self._since_prune += 1
            return
        with self._lock:
            try:
                self.dialect.set_busy_timeout(self.db, min(0.25, self.busy_timeout))
                with self.transaction() as txn:
                    txn.execute(_LOG_INSERT, row)
                    self._since_prune += 1
            except StoreBusy:
                self._defer(row)
                return
            finally:
                self.dialect.set_busy_timeout(self.db, self.busy_timeout)

    def maintain(self) -> None:
        """Housekeeping off the request path (the server calls it every few seconds): retention when due."""
        if self._since_prune >= self.PRUNE_EVERY:
            self.prune()

    def _defer(self, row: tuple[Any, ...]) -> None:
        if len(self._deferred) >= self.MAX_DEFERRED_LOG_ROWS:
            self._deferred.pop(0)
            self._dropped += 1
            if self._dropped in (1, 100, 10_000) or self._dropped % 100_000 == 0:
                log.warning("query log: the store stayed locked; %d log row(s) of refused requests dropped",
                            self._dropped)
        self._deferred.append(row)

    def _flush_deferred(self, txn: Transaction) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = []
        if self._deferred:
            rows, self._deferred = self._deferred, []
            try:
                txn.executemany(_LOG_INSERT, rows)
            except BaseException:
                self._deferred[:0] = rows
                raise
            self._since_prune += len(rows)
        return rows

    def prune(self) -> int:
        """Apply the retention settings (log rows older than ``retention_days`` of serving time or beyond
        ``max_rows``; detector states of keys unseen for ``retention_days``); rows deleted."""
        deleted = 0
        with self._lock:
            self._since_prune = 0
            try:
                with self.transaction() as txn:
                    if self.retention_days is not None:
                        cut = self.clock() - 86400.0 * self.retention_days
                        deleted += txn.execute("DELETE FROM queries WHERE svc_time < ?", (cut,)).rowcount
                        stale = [r[0] for r in txn.execute("SELECT key FROM prada_state WHERE updated < ?",
                                                           (cut,)).fetchall()]
                        for key in stale:
                            for t in ("prada_members", "prada_dist", "prada_state"):
                                deleted += txn.execute(f"DELETE FROM {t} WHERE key = ?", (key,)).rowcount
                    if self.max_rows is not None:
                        deleted += txn.execute("DELETE FROM queries WHERE id <= (SELECT MAX(id) FROM queries) - ?",
                                               (self.max_rows,)).rowcount
            except StoreBusy:
                log.warning("query log: retention skipped, the store is locked by another process")
                return 0
        if deleted:
            log.info("guard store: %d row(s) past the retention deleted", deleted)
        return deleted

    def close(self) -> None:
        with self._lock:
            if self._deferred:
                try:
                    with self.transaction():
                        pass  # flushes the deferred log rows
                except Exception:  # noqa: BLE001 - closing: say what is lost
                    log.warning("query log: %d deferred log row(s) could not be written", len(self._deferred))
            self.db.close()


_LOG_INSERT = ("INSERT INTO queries(ts, svc_time, key_name, rows, status, code, max_l1, ms, request_id) "
               "VALUES(?,?,?,?,?,?,?,?,?)")


class Store(Protocol):
    """What the guard needs of its store (implemented by :class:`~.sqlite.SQLiteStore` and
    :class:`~.postgres.PostgresStore`; both are checked by one conformance suite, tests/extraction/test_store.py)."""

    shared: bool
    busy_timeout: float
    retention_days: float | None
    max_rows: int | None

    def transaction(self, wait: bool = True) -> Any: ...

    def used(self, key_name: str) -> int: ...

    def usage(self) -> dict[str, int]: ...

    def reset_usage(self, key_name: str, used: int = 0) -> None: ...

    def stored_keys(self) -> list[StoredKey]: ...

    def add_key(self, name: str, key: str, budget: int | None) -> None: ...

    def revoke_key(self, name: str) -> None: ...

    def centroids_from(self, table: str, start: int, k: int) -> tuple[np.ndarray, np.ndarray]: ...

    def rewrite_centroids(self, table: str, labels: np.ndarray, vectors: np.ndarray) -> None: ...

    def clear_centroids(self, table: str) -> None: ...

    def log(self, key_name: str | None, rows: int, status: int, code: str, max_l1: float | None, ms: float,
            request_id: str | None = None, wait: bool = True) -> None: ...

    def prune(self) -> int: ...

    def pin(self, key: str, value: str) -> str | None: ...

    def marks(self) -> list[tuple[str, bytes, int, int]]: ...

    def marked_rows(self) -> int: ...

    def detector_summary(self) -> list[tuple[str, int, float | None, bool, int | None, int]]:
        """(key, queries, latest W, flagged now, first flagged at, times flagged) for every key with a state."""
        with self._lock:
            rows = self.db.execute(self.dialect.sql(
                "SELECT key, queries, last_w, flag_time, flagged_at, flags FROM prada_state WHERE version > 0 "
                "ORDER BY key")).fetchall()
        return [(k, int(q or 0), w, t is not None, None if f is None else int(f), int(n or 0))
                for k, q, w, t, f, n in rows]

    def load_detector_state(self, key: str, cached: KeyState | None = None) -> KeyState | None: ...

    def close(self) -> None: ...
