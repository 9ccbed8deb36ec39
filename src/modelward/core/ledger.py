"""SQLite run ledger: the single source of truth for which runs of a study are finished.

A run is recorded as done in one transaction together with its result, so an interrupted study (Ctrl-C or
kill -9) resumes by re-running exactly the runs that are not done; finished runs are never recomputed and a
run can never be recorded twice (``finish`` is idempotent).

A ledger that cannot be trusted is refused with one line naming the file and what to do, never silently started
over: a 0-byte ledger in a folder that already holds results (its record of finished runs is lost), a file that
is not SQLite or is another program's database, a damaged database, a full disk.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from modelward.errors import LedgerError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id   TEXT PRIMARY KEY,
    spec     TEXT NOT NULL,
    status   TEXT NOT NULL CHECK (status IN ('pending', 'running', 'done', 'failed')),
    result   TEXT,
    error    TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    worker   TEXT,
    updated  REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


_OWN_FILES = ("-wal", "-shm", "-journal")
_TABLES = {"runs", "meta"}


def ledger_error(path: Path, e: BaseException) -> LedgerError:
    """One line for a SQLite or OS error on the ledger at `path`: what happened and what to do."""
    text = str(e)
    if (isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)) or "disk is full" in text:
        return LedgerError(f"{path}: cannot write the ledger, the disk is full ({text}); free some space and run the "
                           "same command again (finished runs are kept)")
    if "disk I/O error" in text:
        return LedgerError(f"{path}: cannot write the ledger ({text}): is the disk full or failing? Free some space "
                           "and run the same command again (finished runs are kept)")
    if "locked" in text or "busy" in text:
        return LedgerError(f"{path}: the ledger stayed locked by another process for 60 s ({text}); is another "
                           "command using this --out folder?")
    if isinstance(e, sqlite3.DatabaseError):
        return LedgerError(f"{path}: the ledger is damaged or not a modelward ledger ({text}); restore it from a "
                           "backup, or use a new --out folder (delete this one to start over)")
    return LedgerError(f"{path}: cannot use the ledger ({type(e).__name__}: {text})")


def _results_beside(path: Path) -> list[str]:
    """What else the ledger's folder holds (its own -wal/-shm files, locks and config files aside)."""
    own = {path.name + suffix for suffix in ("", *_OWN_FILES)}
    return sorted(p.name for p in path.parent.iterdir()
                  if p.name not in own and not p.name.endswith(".lock") and p.suffix not in (".toml",))


class RunLedger:
    """Runs of a study keyed by a stable ``run_id``; safe to use from several processes at once.

    Raises:
        LedgerError: the file is 0 bytes in a folder with results, not a SQLite database, another program's
            database, damaged, or cannot be written (a full disk); the message names the file and what to do.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ledger_error(self.path.parent, e) from None
        if self.path.is_file() and self.path.stat().st_size == 0:
            beside = _results_beside(self.path)
            if beside:
                raise LedgerError(
                    f"{self.path}: the ledger is empty (0 bytes) but this folder holds results "
                    f"({', '.join(beside[:3])}{', …' if len(beside) > 3 else ''}): the record of finished runs is "
                    "lost. Restore the ledger from a backup, or use a new --out folder (delete this one to start "
                    "over)")
        try:
            conn = sqlite3.connect(self.path, timeout=60.0)
            try:
                tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
                if tables and not _TABLES <= tables:
                    raise LedgerError(f"{self.path}: this is not a modelward run ledger (it holds the tables "
                                      f"{sorted(tables)[:5]}); use a new --out folder, or move this file away")
                conn.execute("PRAGMA journal_mode=WAL")
                conn.executescript(_SCHEMA)
                conn.commit()
            finally:
                conn.close()
        except (sqlite3.Error, OSError) as e:
            raise ledger_error(self.path, e) from None

    @contextmanager
    def _conn(self) -> Iterator[sqlite3.Connection]:
        try:
            conn = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
        except (sqlite3.Error, OSError) as e:
            raise ledger_error(self.path, e) from None
        try:
            try:
                conn.execute("PRAGMA synchronous=FULL")
                conn.execute("BEGIN IMMEDIATE")
            except (sqlite3.Error, OSError) as e:
                raise ledger_error(self.path, e) from None
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException as e:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass  # the transaction is already gone (e.g. SQLite rolled it back on a full disk)
                if isinstance(e, sqlite3.Error | OSError):
                    raise ledger_error(self.path, e) from None
                raise
        finally:
            conn.close()

    # -- study-level metadata -------------------------------------------------------------------------
    def check_meta(self, key: str, value: str) -> None:
        """Record `value` under `key`, or fail if the folder already holds a study with another value."""
        with self._conn() as c:
            row = c.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
            if row is None:
                c.execute("INSERT INTO meta VALUES (?, ?)", (key, value))
            elif row[0] != value:
                raise LedgerError(
                    f"{self.path}: this folder holds a study with a different '{key}'. "
                    "Use a new --out folder, or delete the old one to start over."
                )

    def bind_config(self, config: Any, *, exclude: set[str] | None = None, legacy: tuple[str, ...] = ()) -> str:
        """Bind this ledger to one configuration: the first call records its fingerprint, later calls (a resume)
        must present the same configuration or a :class:`LedgerError` is raised.

        This is the one config fingerprint of every study. Args: `config` — a pydantic model (dumped in JSON
        mode) or any JSON-able object; `exclude` — top-level fields that may change between resumes (e.g.
        ``{"threads"}``); `legacy` — fingerprints an older version of the study recorded for this same config
        (they are upgraded in place, so folders from before keep resuming). Returns the fingerprint (SHA-256 of
        the canonical JSON).
        """
        import hashlib

        if hasattr(config, "model_dump"):
            data = config.model_dump(mode="json", exclude=exclude)
        elif isinstance(config, dict) and exclude:
            data = {k: v for k, v in config.items() if k not in exclude}
        else:
            data = config
        fingerprint = hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()
        if legacy:
            marks = ",".join("?" * len(legacy))
            with self._conn() as c:
                c.execute(f"UPDATE meta SET value=? WHERE key='config' AND value IN ({marks})", (fingerprint, *legacy))
        self.check_meta("config", fingerprint)
        return fingerprint

    def get_meta(self, key: str) -> str | None:
        with self._conn() as c:
            row = c.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else row[0]

    # -- runs -------------------------------------------------------------------------------------------
    def add(self, run_id: str, spec: dict[str, Any]) -> None:
        """Register a run (no-op if it exists with the same spec; error if the spec differs)."""
        blob = json.dumps(spec, sort_keys=True)
        with self._conn() as c:
            row = c.execute("SELECT spec FROM runs WHERE run_id=?", (run_id,)).fetchone()
            if row is None:
                c.execute(
                    "INSERT INTO runs (run_id, spec, status, updated) VALUES (?, ?, 'pending', ?)",
                    (run_id, blob, time.time()),
                )
            elif row[0] != blob:
                raise LedgerError(f"{self.path}: run {run_id!r} already exists with a different spec")

    def recover(self) -> int:
        """Mark runs left 'running' by a dead process as pending again; returns how many."""
        with self._conn() as c:
            cur = c.execute("UPDATE runs SET status='pending', worker=NULL WHERE status='running'")
            return cur.rowcount

    def start(self, run_id: str, worker: str | None = None) -> bool:
        """Claim a pending run; False if it is already done or claimed."""
        with self._conn() as c:
            cur = c.execute(
                "UPDATE runs SET status='running', attempts=attempts+1, worker=?, updated=? "
                "WHERE run_id=? AND status IN ('pending', 'failed')",
                (worker or str(os.getpid()), time.time(), run_id),
            )
            return cur.rowcount == 1

    def finish(self, run_id: str, result: dict[str, Any]) -> bool:
        """Record the result; idempotent: a run already done keeps its first result and False is returned."""
        with self._conn() as c:
            cur = c.execute(
                "UPDATE runs SET status='done', result=?, error=NULL, updated=? WHERE run_id=? AND status!='done'",
                (json.dumps(result, sort_keys=True), time.time(), run_id),
            )
            return cur.rowcount == 1

    def fail(self, run_id: str, error: str) -> None:
        with self._conn() as c:
            c.execute(
                "UPDATE runs SET status='failed', error=?, updated=? WHERE run_id=? AND status!='done'",
                (error[-4000:], time.time(), run_id),
            )

    def reopen(self, run_id: str) -> bool:
        """Put a run back to pending, its result dropped, so the next run_plan recomputes it: its output turned out
        damaged, or a section could not be assessed before its cause was fixed. Returns whether a run that was not
        already pending was reopened."""
        with self._conn() as c:
            cur = c.execute("UPDATE runs SET status='pending', result=NULL, worker=NULL, updated=? "
                            "WHERE run_id=? AND status!='pending'", (time.time(), run_id))
            return cur.rowcount == 1

    def status(self, run_id: str) -> str | None:
        with self._conn() as c:
            row = c.execute("SELECT status FROM runs WHERE run_id=?", (run_id,)).fetchone()
        return None if row is None else row[0]

    def pending(self) -> list[str]:
        with self._conn() as c:
            rows = c.execute("SELECT run_id FROM runs WHERE status!='done' ORDER BY run_id").fetchall()
        return [r[0] for r in rows]

    def spec(self, run_id: str) -> dict[str, Any]:
        with self._conn() as c:
            row = c.execute("SELECT spec FROM runs WHERE run_id=?", (run_id,)).fetchone()
        if row is None:
            raise LedgerError(f"{self.path}: no run {run_id!r}")
        try:
            return json.loads(row[0])
        except (TypeError, ValueError):
            raise self._damaged("spec", [run_id]) from None

    def results(self) -> dict[str, dict[str, Any]]:
        with self._conn() as c:
            rows = c.execute("SELECT run_id, result FROM runs WHERE status='done' ORDER BY run_id").fetchall()
        out, bad = {}, []
        for run_id, text in rows:
            try:
                out[run_id] = json.loads(text)
            except (TypeError, ValueError):
                bad.append(run_id)
        if bad:
            raise self._damaged("result", bad)
        return out

    def _damaged(self, what: str, run_ids: list[str]) -> LedgerError:
        """One line for stored JSON that does not parse: nothing is changed, so nothing is lost."""
        shown = ", ".join(repr(r) for r in run_ids[:3]) + (f" and {len(run_ids) - 3} more" if len(run_ids) > 3 else "")
        return LedgerError(f"{self.path}: the recorded {what} of run(s) {shown} is damaged (not valid JSON); nothing "
                           "was changed. Restore the ledger from a backup, or recompute those runs (RunLedger.reopen: "
                           "the next run of the same command redoes only them)")

    def counts(self) -> dict[str, int]:
        with self._conn() as c:
            rows = c.execute("SELECT status, COUNT(*) FROM runs GROUP BY status").fetchall()
        out = {"pending": 0, "running": 0, "done": 0, "failed": 0}
        out.update({r[0]: r[1] for r in rows})
        return out

    def errors(self) -> dict[str, str]:
        with self._conn() as c:
            rows = c.execute("SELECT run_id, error FROM runs WHERE status='failed'").fetchall()
        return {r[0]: r[1] for r in rows}
