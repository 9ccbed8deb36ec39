"""The guard's SQLite store: the query log, per-key usage (budgets survive restarts) and ModelGuard-S centroids.

Storage only: a request the budget cannot pay for raises :class:`~modelward.extraction.guard.errors.BudgetExceeded`
(the service answers it as 429); nothing here knows about HTTP.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import numpy as np

from modelward.errors import DataError
from modelward.extraction.guard.errors import BudgetExceeded


class QueryLog:
    """SQLite query log + per-key usage (budgets survive restarts).

    Budgets are charged with one conditional ``UPDATE`` (atomic in SQLite, also across processes): a request is
    answered only if ``used + rows <= budget`` held at the instant its rows were added, so concurrent requests can
    never over-spend a key. WAL with ``synchronous=NORMAL``: a commit does not wait for fsync (the database stays
    consistent after a crash; only the last transactions can be lost on power failure).

    Args:
        path: the SQLite file (created with its folder).

    Example:
        >>> log = QueryLog(Path(tmp) / "queries.sqlite")  # doctest: +SKIP
        >>> log.reserve("alice", 16, budget=100); log.used("alice")  # doctest: +SKIP
        16
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=30.0)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS usage (key_name TEXT PRIMARY KEY, used INTEGER NOT NULL)")
        self.db.execute("CREATE TABLE IF NOT EXISTS queries (id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL, "
                        "key_name TEXT, rows INTEGER, status INTEGER, code TEXT, max_l1 REAL, ms REAL)")
        self._lock = threading.Lock()
        self._known: set[str] = set()  # keys whose usage row exists

    def used(self, key_name: str) -> int:
        with self._lock:
            row = self.db.execute("SELECT used FROM usage WHERE key_name=?", (key_name,)).fetchone()
        return int(row[0]) if row else 0

    def reserve(self, key_name: str, rows: int, budget: int | None) -> None:
        """Charge ``rows`` to the key atomically, or raise BudgetExceeded (nothing charged) when it would overspend."""
        with self._lock:
            if key_name not in self._known:
                self.db.execute("INSERT OR IGNORE INTO usage(key_name, used) VALUES(?, 0)", (key_name,))
                self._known.add(key_name)
            if budget is None:
                self.db.execute("UPDATE usage SET used = used + ? WHERE key_name = ?", (rows, key_name))
                return
            cur = self.db.execute("UPDATE usage SET used = used + ? WHERE key_name = ? AND used + ? <= ?",
                                  (rows, key_name, rows, budget))
            if cur.rowcount == 1:
                return
            used = int(self.db.execute("SELECT used FROM usage WHERE key_name=?", (key_name,)).fetchone()[0])
        raise BudgetExceeded(key_name, used, budget, rows)

    def append_centroids(self, table: str, start: int, labels: np.ndarray, vectors: np.ndarray) -> None:
        """Persist centroids ``start, start + 1, ...`` (one transaction; float64 bytes)."""
        rows = [(start + i, int(c), np.ascontiguousarray(v, dtype="<f8").tobytes())
                for i, (c, v) in enumerate(zip(labels, vectors, strict=True))]
        with self._lock:
            self.db.execute(f"CREATE TABLE IF NOT EXISTS {table} (seq INTEGER PRIMARY KEY, label INTEGER, vec BLOB)")
            self.db.execute("BEGIN")
            self.db.executemany(f"INSERT OR REPLACE INTO {table}(seq, label, vec) VALUES(?,?,?)", rows)
            self.db.execute("COMMIT")

    def centroids_from(self, table: str, start: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Centroids with index >= ``start`` in order; they must be contiguous (else the state is inconsistent)."""
        with self._lock:
            self.db.execute(f"CREATE TABLE IF NOT EXISTS {table} (seq INTEGER PRIMARY KEY, label INTEGER, vec BLOB)")
            rows = self.db.execute(f"SELECT seq, label, vec FROM {table} WHERE seq >= ? ORDER BY seq",
                                   (start,)).fetchall()
        if rows and [r[0] for r in rows] != list(range(start, start + len(rows))):
            raise DataError(f"{table}: centroid rows are not contiguous after {start}; start a new state with --reset")
        labels = np.array([r[1] for r in rows], dtype=np.int64)
        vecs = np.stack([np.frombuffer(r[2], dtype="<f8") for r in rows]) if rows else np.zeros((0, k))
        return labels, vecs

    def clear_centroids(self, table: str) -> None:
        with self._lock:
            self.db.execute(f"DROP TABLE IF EXISTS {table}")

    def refund(self, key_name: str, rows: int) -> None:
        """Give back a reservation whose request failed before it was answered."""
        with self._lock:
            self.db.execute("UPDATE usage SET used = MAX(0, used - ?) WHERE key_name = ?", (rows, key_name))

    def charge(self, key_name: str, rows: int) -> None:
        self.reserve(key_name, rows, None)

    def log(self, key_name: str | None, rows: int, status: int, code: str, max_l1: float | None, ms: float) -> None:
        with self._lock:
            self.db.execute("INSERT INTO queries(ts, key_name, rows, status, code, max_l1, ms) "
                            "VALUES(?,?,?,?,?,?,?)", (time.time(), key_name, rows, status, code, max_l1, ms))

    def close(self) -> None:
        with self._lock:
            self.db.close()
