"""Append-only, hash-chained audit log in SQLite (issue 3 item 4).

Every record carries ``prev_hash`` (the previous record's hash) and ``hash = sha256(prev_hash ‖ canonical JSON of
its fields, including its id)``. Editing a record breaks its own hash; deleting, inserting or reordering records
breaks the chain. A party that also publishes its latest head hash to its peers (the driver records every party's
head at the end of a run) makes even a full rewrite of the log detectable.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelward.errors import ModelwardError

GENESIS = "0" * 64
FIELDS = ("id", "ts", "party", "caller", "op", "session", "step", "seq", "batch", "shapes", "decision", "reason")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS audit (
  id INTEGER PRIMARY KEY, ts REAL NOT NULL, party TEXT NOT NULL, caller TEXT NOT NULL, op TEXT NOT NULL,
  session TEXT NOT NULL, step INTEGER NOT NULL, seq INTEGER NOT NULL, batch INTEGER NOT NULL,
  shapes TEXT NOT NULL, decision TEXT NOT NULL, reason TEXT NOT NULL, prev_hash TEXT NOT NULL, hash TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS audit_session ON audit(session, decision, op);
CREATE INDEX IF NOT EXISTS audit_ts ON audit(ts, decision);
"""


class AuditError(ModelwardError):
    """The audit log cannot be opened or written."""


def record_hash(prev_hash: str, rec: dict[str, Any]) -> str:
    body = json.dumps([rec[f] for f in FIELDS], separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256((prev_hash + body).encode()).hexdigest()


class AuditLog:
    """Thread-safe appender. Records are written (and committed) before the response leaves the party."""

    def __init__(self, path: str | Path, party: str) -> None:
        self.path, self.party = Path(path), party
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as e:
            raise AuditError(f"{self.path}: cannot open audit log ({e})") from None
        self.lock = threading.Lock()
        row = self.db.execute("SELECT id, hash FROM audit ORDER BY id DESC LIMIT 1").fetchone()
        self.last_id, self.head = (row[0], row[1]) if row else (0, GENESIS)

    def append(self, caller: str, op: str, session: str = "", step: int = 0, seq: int = 0, batch: int = 0,
               shapes: dict[str, list[int]] | None = None, decision: str = "allow", reason: str = "") -> str:
        with self.lock:
            rec = {"id": self.last_id + 1, "ts": round(time.time(), 6), "party": self.party, "caller": caller,
                   "op": op, "session": session, "step": int(step), "seq": int(seq), "batch": int(batch),
                   "shapes": json.dumps(shapes or {}, sort_keys=True, separators=(",", ":")),
                   "decision": decision, "reason": reason}
            h = record_hash(self.head, rec)
            self.db.execute(f"INSERT INTO audit ({','.join(FIELDS)}, prev_hash, hash) VALUES "
                            f"({','.join('?' * (len(FIELDS) + 2))})", [*(rec[f] for f in FIELDS), self.head, h])
            self.last_id, self.head = rec["id"], h
            return h

    def count(self, ops: tuple[str, ...], session: str | None = None, since: float | None = None,
              decision: str = "allow") -> int:
        q = f"SELECT COUNT(*) FROM audit WHERE decision = ? AND op IN ({','.join('?' * len(ops))})"
        args: list[Any] = [decision, *ops]
        if session is not None:
            q += " AND session = ?"
            args.append(session)
        if since is not None:
            q += " AND ts >= ?"
            args.append(since)
        with self.lock:
            return int(self.db.execute(q, args).fetchone()[0])

    def last_seq(self, session: str) -> int:
        with self.lock:
            row = self.db.execute("SELECT MAX(seq) FROM audit WHERE session = ? AND decision = 'allow'", (session,)).fetchone()
        return int(row[0] or 0)

    def close(self) -> None:
        with self.lock:
            self.db.close()


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    records: int
    head: str
    bad_id: int | None = None
    problem: str = ""
    head_at: int | None = None  # the record whose hash is the published head, when one was given

    def __str__(self) -> str:
        if self.ok:
            extra = ""
            if self.head_at is not None:
                extra = f"; the published head is record {self.head_at}"
                if self.head_at < self.records:
                    extra += f", {self.records - self.head_at} record(s) appended after it"
            return f"OK: {self.records} records, head {self.head[:16]}…{extra}"
        return f"TAMPERED: record {self.bad_id}: {self.problem}"


def verify(path: str | Path, expect_head: str | None = None) -> VerifyResult:
    """Walk the chain; report the first record that was edited, deleted, inserted or reordered."""
    path = Path(path)
    if not path.is_file():
        raise AuditError(f"{path}: audit log not found")
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        rows = db.execute(f"SELECT {','.join(FIELDS)}, prev_hash, hash FROM audit ORDER BY id").fetchall()
        db.close()
    except sqlite3.DatabaseError as e:
        raise AuditError(f"{path}: not a modelward audit log ({e})") from None
    if expect_head is not None:
        expect_head = expect_head.strip().lower()
        if len(expect_head) < 16 or any(c not in "0123456789abcdef" for c in expect_head):
            raise AuditError(f"--head {expect_head!r}: expected the published head hash (hex, at least its "
                             "first 16 characters, as in summary.json's audit_heads)")
    prev, expected_id = GENESIS, 1
    head_at: int | None = None
    for row in rows:
        rec = dict(zip(FIELDS, row[: len(FIELDS)], strict=True))
        stored_prev, stored = row[-2], row[-1]
        rid = rec["id"]
        if rid != expected_id:
            return VerifyResult(False, len(rows), prev, rid, f"expected record id {expected_id}: "
                                f"record(s) {expected_id}..{rid - 1} were deleted" if rid > expected_id
                                else "record id out of sequence (inserted)")
        if stored_prev != prev:
            return VerifyResult(False, len(rows), prev, rid, "chain broken: the previous record was deleted, "
                                "inserted or reordered (prev_hash does not match)")
        if record_hash(prev, rec) != stored:
            return VerifyResult(False, len(rows), prev, rid, "edited: its content does not match its hash")
        prev, expected_id = stored, rid + 1
        if expect_head is not None and head_at is None and stored.startswith(expect_head):
            head_at = rid
    # The published head must be a record of the intact chain: records appended after it (a later session,
    # split predict) are legitimate; a truncation or a rewrite removes it.
    if expect_head is not None and head_at is None:
        return VerifyResult(False, len(rows), prev, expected_id - 1,
                            f"the published head {expect_head[:16]}… is not in the chain (head now "
                            f"{prev[:16]}…): records were removed from the end or the log was rewritten")
    return VerifyResult(True, len(rows), prev, head_at=head_at)
