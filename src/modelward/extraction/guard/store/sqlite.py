"""The embedded default store: one SQLite file in the guard's ``state_dir`` (one server per folder).

WAL with ``synchronous=NORMAL``: a commit does not wait for fsync (the database stays consistent after a crash; only
the last transactions can be lost on power failure). A server moves the WAL checkpoints — copying the WAL into the
database file, with its fsyncs — off the request path (:meth:`SQLiteStore.start_checkpointer`): SQLite's automatic
checkpoint runs inside the commit that fills 1,000 pages, which made every ~100th request 5–10 ms slower (the
guard's p99). Another process holding the write lock (an operator's
``sqlite3`` shell, ``guard keys``) makes a write wait at most ``busy_timeout`` seconds, then fail with
:class:`~.base.StoreBusy`; the HTTP layer runs every waiting call off its event loop, so health checks still answer.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path
from typing import Any

from modelward.extraction.guard.errors import WouldBlock
from modelward.extraction.guard.store.base import SQLStore, Transaction

log = logging.getLogger("modelward.guard")
#: with a checkpointer running, the commit that fills this many WAL pages still checkpoints itself (a stalled
#: checkpointer must not let the WAL grow without bound): 64 MiB at SQLite's 4 KiB pages
FALLBACK_AUTOCHECKPOINT = 16384


class SQLiteDialect:
    name = "sqlite"
    types = {"blob": "BLOB", "real": "REAL", "int": "INTEGER", "serial_pk": "INTEGER PRIMARY KEY AUTOINCREMENT"}
    row_locks = False  # one process writes (the state_dir lock): BEGIN IMMEDIATE serialises every request

    def __init__(self, busy_timeout: float) -> None:
        self.busy_timeout = busy_timeout

    def sql(self, stmt: str) -> str:
        return stmt

    def begin(self, db: Any, wait: bool) -> None:
        if wait:
            db.execute("BEGIN IMMEDIATE")
            return
        db.execute("PRAGMA busy_timeout = 0")
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as e:
            if self.is_busy(e):
                raise WouldBlock from None
            raise
        finally:
            db.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")

    def is_busy(self, e: BaseException) -> bool:
        return isinstance(e, sqlite3.OperationalError) and ("locked" in str(e) or "busy" in str(e))

    def blob(self, b: bytes) -> Any:
        return b

    def tables(self, txn: Transaction) -> set[str]:
        return {r[0] for r in txn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()}

    def columns(self, txn: Transaction, table: str) -> set[str]:
        return {r[1] for r in txn.execute(f"PRAGMA table_info({table})").fetchall()}

    def migration_lock(self, txn: Transaction) -> None:
        pass  # BEGIN IMMEDIATE already excludes every other writer

    def set_busy_timeout(self, db: Any, seconds: float) -> None:
        db.execute(f"PRAGMA busy_timeout = {int(seconds * 1000)}")


class SQLiteStore(SQLStore):
    """The guard's store in one SQLite file (see :class:`~.base.SQLStore` for the arguments).

    Args:
        path: the SQLite file (created with its folder).

    Example:
        >>> store = SQLiteStore(Path(tmp) / "queries.sqlite", retention_days=90)  # doctest: +SKIP
    """

    shared = False

    def __init__(self, path: Path, busy_timeout: float = 5.0, retention_days: float | None = None,
                 max_rows: int | None = None, detector_window: int = 1000) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.where = path, str(path)
        self.dialect = SQLiteDialect(busy_timeout)
        self.db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=busy_timeout)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self._setup(busy_timeout, retention_days, max_rows, detector_window)
        # a second connection for reads that must never wait (WAL: readers do not block on the writer)
        self._reader = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=0.05)
        self._reader_lock = threading.Lock()
        self._checkpointer: threading.Thread | None = None
        self._stop_checkpoints = threading.Event()

    def start_checkpointer(self, every: float = 0.2) -> None:
        """Checkpoint the WAL every ``every`` seconds from a thread of its own connection (``PASSIVE``: it never
        waits for, or blocks, a request's transaction; SQLite releases the GIL while it copies and syncs), and let
        commits checkpoint only past :data:`FALLBACK_AUTOCHECKPOINT` pages. Until :meth:`close`."""
        if self._checkpointer is not None:
            return
        with self._lock:
            self.db.execute(f"PRAGMA wal_autocheckpoint = {FALLBACK_AUTOCHECKPOINT}")
        conn = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None, timeout=0.05)

        def loop() -> None:
            try:
                while not self._stop_checkpoints.wait(every):
                    try:
                        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    except sqlite3.Error as e:  # busy, or a full disk: the next round (or a commit) does it
                        log.debug("guard store: WAL checkpoint skipped (%s)", e)
            finally:
                conn.close()

        self._checkpointer = threading.Thread(target=loop, name="guard-wal-checkpoint", daemon=True)
        self._checkpointer.start()

    def used_nowait(self, key_name: str) -> int | None:
        if not self._reader_lock.acquire(blocking=False):
            return None
        try:
            row = self._reader.execute("SELECT used FROM usage WHERE key_name = ?", (key_name,)).fetchone()
        except sqlite3.OperationalError:
            return None
        finally:
            self._reader_lock.release()
        return int(row[0]) if row else 0

    def close(self) -> None:
        self._stop_checkpoints.set()
        if self._checkpointer is not None:
            self._checkpointer.join(10)
            self._checkpointer = None
        with self._reader_lock:
            self._reader.close()
        super().close()
