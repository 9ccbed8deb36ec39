"""The guard's SQLite store: the query log, per-key usage (budgets survive restarts), API keys added by operators
and ModelGuard-S centroids.

Storage only: a request the budget cannot pay for raises :class:`~modelward.extraction.guard.errors.BudgetExceeded`
(the service answers it as 429); nothing here knows about HTTP. Every answered request is one transaction
(:meth:`QueryLog.transaction`): its charge, its new centroids and its log row are committed together or not at all,
so a full disk or a crash never leaves a charge without an answer or a centroid in memory that is not on disk.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modelward.extraction.guard.errors import BudgetExceeded, WouldBlock

log = logging.getLogger("modelward.guard")

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS usage (key_name TEXT PRIMARY KEY, used INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS queries (id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL, key_name TEXT, "
    "rows INTEGER, status INTEGER, code TEXT, max_l1 REAL, ms REAL)",
    # keys added with `modelward guard keys add` (only the SHA-256 of the key is stored) and revocations of any key
    "CREATE TABLE IF NOT EXISTS api_keys (name TEXT PRIMARY KEY, key_sha256 TEXT UNIQUE, budget INTEGER, "
    "revoked INTEGER NOT NULL DEFAULT 0, created REAL)",
)


def key_digest(key: str) -> str:
    """The SHA-256 (hex) under which an operator-added API key is stored."""
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class StoredKey:
    """An API key row of the store: added by an operator (``key_sha256`` set) or a revocation of a config key."""

    name: str
    key_sha256: str | None
    budget: int | None
    revoked: bool


class Transaction:
    """The writes of one answered request, inside :meth:`QueryLog.transaction` (all of them commit, or none)."""

    def __init__(self, store: QueryLog) -> None:
        self.store = store

    def charge(self, key_name: str, rows: int, budget: int | None) -> None:
        """Add ``rows`` to the key's usage, or raise BudgetExceeded when ``used + rows > budget``."""
        db = self.store.db
        db.execute("INSERT OR IGNORE INTO usage(key_name, used) VALUES(?, 0)", (key_name,))
        if budget is None:
            db.execute("UPDATE usage SET used = used + ? WHERE key_name = ?", (rows, key_name))
            return
        cur = db.execute("UPDATE usage SET used = used + ? WHERE key_name = ? AND used + ? <= ?",
                         (rows, key_name, rows, budget))
        if cur.rowcount != 1:
            used = int(db.execute("SELECT used FROM usage WHERE key_name=?", (key_name,)).fetchone()[0])
            raise BudgetExceeded(key_name, used, budget, rows)

    def append_centroids(self, table: str, start: int, labels: np.ndarray, vectors: np.ndarray) -> None:
        """Persist centroids ``start, start + 1, ...`` (float64 bytes)."""
        rows = [(start + i, int(c), np.ascontiguousarray(v, dtype="<f8").tobytes())
                for i, (c, v) in enumerate(zip(labels, vectors, strict=True))]
        self.store.db.executemany(f"INSERT INTO {table}(seq, label, vec) VALUES(?,?,?)", rows)

    def log(self, key_name: str | None, rows: int, status: int, code: str, max_l1: float | None, ms: float,
            request_id: str | None = None) -> None:
        self.store._insert_log(key_name, rows, status, code, max_l1, ms, request_id)


class QueryLog:
    """SQLite query log + per-key usage (budgets survive restarts) + operator keys + centroid rows.

    Budgets are charged with one conditional ``UPDATE`` (atomic in SQLite, also across processes): a request is
    answered only if ``used + rows <= budget`` held at the instant its rows were added, so concurrent requests can
    never over-spend a key. WAL with ``synchronous=NORMAL``: a commit does not wait for fsync (the database stays
    consistent after a crash; only the last transactions can be lost on power failure). Another process holding
    the write lock (an operator's ``sqlite3`` shell, ``guard keys``) makes a write wait at most ``busy_timeout``
    seconds, then fail; the HTTP layer runs every call here off its event loop, so health checks still answer.

    Args:
        path: the SQLite file (created with its folder).
        busy_timeout: seconds a statement waits for another connection's lock.
        retention_days: log rows older than this are deleted (checked on open and every 10,000 rows); None = keep.
        max_rows: keep at most this many log rows (the oldest go first); None = no cap.

    Example:
        >>> store = QueryLog(Path(tmp) / "queries.sqlite")  # doctest: +SKIP
        >>> with store.transaction() as txn:  # doctest: +SKIP
        ...     txn.charge("alice", 16, budget=100)
        >>> store.used("alice")  # doctest: +SKIP
        16
    """

    PRUNE_EVERY = 10_000

    def __init__(self, path: Path, busy_timeout: float = 5.0, retention_days: float | None = None,
                 max_rows: int | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.busy_timeout = path, busy_timeout
        self.db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=busy_timeout)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        for stmt in _SCHEMA:
            self.db.execute(stmt)
        cols = {r[1] for r in self.db.execute("PRAGMA table_info(queries)")}
        if "request_id" not in cols:  # a log written by an older version
            self.db.execute("ALTER TABLE queries ADD COLUMN request_id TEXT")
        self.db.execute("CREATE INDEX IF NOT EXISTS queries_ts ON queries(ts)")
        self.retention_days, self.max_rows = retention_days, max_rows
        self._lock = threading.RLock()
        self._since_prune = 0
        self.prune()

    # ------------------------------------------------------------------ transactions
    @contextmanager
    def transaction(self, wait: bool = True) -> Iterator[Transaction]:
        """One write transaction (``BEGIN IMMEDIATE``): committed when the block ends, rolled back if it raises.

        Holds this store's lock for the whole block, so the writes of two requests never interleave. ``wait=False``:
        raise WouldBlock at once (nothing written) when another thread or process holds the lock, instead of
        waiting up to the busy timeout.
        """
        if not self._lock.acquire(blocking=wait):
            raise WouldBlock
        try:
            if wait:
                self.db.execute("BEGIN IMMEDIATE")
            else:
                self.db.execute("PRAGMA busy_timeout = 0")
                try:
                    self.db.execute("BEGIN IMMEDIATE")
                except sqlite3.OperationalError as e:
                    if "locked" in str(e) or "busy" in str(e):
                        raise WouldBlock from None
                    raise
                finally:
                    self.db.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            try:
                yield Transaction(self)
                self.db.execute("COMMIT")
            except BaseException:
                if self.db.in_transaction:
                    self.db.execute("ROLLBACK")
                raise
        finally:
            self._lock.release()

    # ------------------------------------------------------------------ budgets
    def used(self, key_name: str) -> int:
        with self._lock:
            row = self.db.execute("SELECT used FROM usage WHERE key_name=?", (key_name,)).fetchone()
        return int(row[0]) if row else 0

    def reserve(self, key_name: str, rows: int, budget: int | None) -> None:
        """Charge ``rows`` to the key atomically, or raise BudgetExceeded (nothing charged) when it would overspend."""
        with self.transaction() as txn:
            txn.charge(key_name, rows, budget)

    def reset_usage(self, key_name: str, used: int = 0) -> None:
        with self._lock:
            self.db.execute("INSERT INTO usage(key_name, used) VALUES(?, ?) ON CONFLICT(key_name) DO UPDATE SET "
                            "used = excluded.used", (key_name, used))

    def usage(self) -> dict[str, int]:
        with self._lock:
            return {k: int(u) for k, u in self.db.execute("SELECT key_name, used FROM usage")}

    # ------------------------------------------------------------------ operator keys
    def stored_keys(self) -> list[StoredKey]:
        with self._lock:
            rows = self.db.execute("SELECT name, key_sha256, budget, revoked FROM api_keys ORDER BY name").fetchall()
        return [StoredKey(n, h, None if b is None else int(b), bool(r)) for n, h, b, r in rows]

    def add_key(self, name: str, key: str, budget: int | None) -> None:
        with self._lock:
            self.db.execute("INSERT INTO api_keys(name, key_sha256, budget, revoked, created) VALUES(?,?,?,0,?)",
                            (name, key_digest(key), budget, time.time()))

    def revoke_key(self, name: str) -> None:
        with self._lock:
            self.db.execute("INSERT INTO api_keys(name, revoked, created) VALUES(?, 1, ?) ON CONFLICT(name) DO "
                            "UPDATE SET revoked = 1", (name, time.time()))

    # ------------------------------------------------------------------ centroids
    def _ensure_table(self, table: str) -> None:
        self.db.execute(f"CREATE TABLE IF NOT EXISTS {table} (seq INTEGER PRIMARY KEY, label INTEGER, vec BLOB)")

    def append_centroids(self, table: str, start: int, labels: np.ndarray, vectors: np.ndarray) -> None:
        """Persist centroids ``start, start + 1, ...`` in one transaction."""
        with self.transaction() as txn:
            self._ensure_table(table)
            txn.append_centroids(table, start, labels, vectors)

    def centroids_from(self, table: str, start: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Centroids with index >= ``start`` in order.

        A gap in the sequence (left by an older version whose append failed after the answer) is repaired, not
        refused: the rows are renumbered in order, so later appends continue the sequence, and a warning says how
        many were missing. Rows that are not K float64 values are dropped the same way.
        """
        with self.transaction():
            self._ensure_table(table)
            rows = self.db.execute(f"SELECT seq, label, vec FROM {table} ORDER BY seq").fetchall()
            good = [r for r in rows if isinstance(r[2], bytes) and len(r[2]) == 8 * k and 0 <= int(r[1]) < k]
            if [r[0] for r in good] != list(range(len(good))):
                missing = (rows[-1][0] + 1 if rows else 0) - len(good)
                log.warning("%s: %d centroid row(s) missing or damaged (a failed write of an older version); "
                            "renumbering the %d others in order", table, missing, len(good))
                self.db.execute(f"DELETE FROM {table}")
                self.db.executemany(f"INSERT INTO {table}(seq, label, vec) VALUES(?,?,?)",
                                    [(i, r[1], r[2]) for i, r in enumerate(good)])
        tail = good[start:]
        labels = np.array([r[1] for r in tail], dtype=np.int64)
        vecs = np.stack([np.frombuffer(r[2], dtype="<f8") for r in tail]) if tail else np.zeros((0, k))
        return labels, vecs

    def rewrite_centroids(self, table: str, labels: np.ndarray, vectors: np.ndarray) -> None:
        """Replace every centroid row by ``labels`` / ``vectors`` (seq 0, 1, ...), in one transaction."""
        with self.transaction() as txn:
            self._ensure_table(table)
            self.db.execute(f"DELETE FROM {table}")
            txn.append_centroids(table, 0, labels, vectors)

    def clear_centroids(self, table: str) -> None:
        with self._lock:
            self.db.execute(f"DROP TABLE IF EXISTS {table}")

    # ------------------------------------------------------------------ log
    def _insert_log(self, key_name: str | None, rows: int, status: int, code: str, max_l1: float | None, ms: float,
                    request_id: str | None) -> None:
        self.db.execute("INSERT INTO queries(ts, key_name, rows, status, code, max_l1, ms, request_id) "
                        "VALUES(?,?,?,?,?,?,?,?)", (time.time(), key_name, rows, status, code, max_l1, ms, request_id))
        self._since_prune += 1
        if self._since_prune >= self.PRUNE_EVERY and not self.db.in_transaction:
            self.prune()

    def log(self, key_name: str | None, rows: int, status: int, code: str, max_l1: float | None, ms: float,
            request_id: str | None = None) -> None:
        """Log a request that changed nothing else (refused, or failed before it was charged)."""
        with self._lock:
            self._insert_log(key_name, rows, status, code, max_l1, ms, request_id)

    def prune(self) -> int:
        """Apply the retention settings (rows older than ``retention_days``, beyond ``max_rows``); rows deleted.

        SQLite reuses the freed pages, so under retention the file stops growing (``VACUUM`` would give them back
        to the file system).
        """
        deleted = 0
        with self._lock:
            self._since_prune = 0
            if self.retention_days is not None:
                cut = time.time() - 86400.0 * self.retention_days
                deleted += self.db.execute("DELETE FROM queries WHERE ts < ?", (cut,)).rowcount
            if self.max_rows is not None:
                deleted += self.db.execute("DELETE FROM queries WHERE id <= (SELECT MAX(id) FROM queries) - ?",
                                           (self.max_rows,)).rowcount
        if deleted:
            log.info("query log: %d row(s) past the retention deleted", deleted)
        return deleted

    def close(self) -> None:
        with self._lock:
            self.db.close()
