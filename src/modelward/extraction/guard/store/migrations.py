"""The guard store's schema, as numbered migrations (the same list for SQLite and PostgreSQL).

A store records the migrations it has run in ``schema_version``; opening it runs the missing ones in order, in one
transaction (PostgreSQL: under an advisory lock, so replicas starting together migrate once). A store written by a
newer version (a higher number than this list knows) is refused, never half-understood. Stores from before this
list (no ``schema_version``) are version 0: migration 1 creates only what is missing.

Type names differ between the two databases; the statements use ``{blob}``, ``{real}``, ``{int}`` and
``{serial_pk}``, filled in by the dialect.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from modelward.extraction.ownership.detector import ClassStats

Step = str | Callable[[Any], None]  # a statement, or a function of the open transaction (the store's Transaction)


@dataclass(frozen=True)
class Migration:
    version: int
    what: str
    steps: tuple[Step, ...]


def _add_column(table: str, column: str, decl: str) -> Callable[[Any], None]:
    def run(txn: Any) -> None:
        if column not in txn.store.dialect.columns(txn, table):
            txn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl.format(**txn.store.dialect.types)}")
    return run


def _service_clock_from_wall_clock(txn: Any) -> None:
    # rows written before the service clock existed: their wall-clock time is the best service time known
    txn.execute("UPDATE queries SET svc_time = ts WHERE svc_time IS NULL")


def _convert_prada_events(txn: Any) -> None:
    """The event rows of the first detector (one per answered row, never pruned) become the bounded state: the
    admitted queries are the growing set (at most 2,000 per key, the first ones), the latest 1,000 distances the
    window (as log distances), and the thresholds are recomputed from the admitting distances."""
    if "prada_events" not in txn.store.dialect.tables(txn):
        return
    keys = [r[0] for r in txn.execute("SELECT DISTINCT key FROM prada_events").fetchall()]
    for key in keys:
        rows = txn.execute("SELECT cls, d_min, admitted, vec FROM prada_events WHERE key = ? ORDER BY seq",
                           (key,)).fetchall()
        stats: dict[int, ClassStats] = {}
        members, dists = [], []
        dim = 0
        for cls, d, admitted, vec in rows:
            cs = stats.setdefault(int(cls), ClassStats())
            if d is not None and not math.isnan(d) and d > 0:
                dists.append(math.log(d))
            if admitted and vec is not None and len(members) < 2000:
                members.append((len(members), int(cls), bytes(vec)))
                dim = len(vec) // 4
                if d is not None and not math.isnan(d):
                    cs.admit(float(d))
        flag = txn.execute("SELECT flagged_at, time FROM prada_flags WHERE key = ?", (key,)).fetchone()
        window = dists[-1000:]
        txn.executemany("INSERT INTO prada_members(key, seq, cls, vec) VALUES (?, ?, ?, ?)",
                        [(key, s, c, txn.store.dialect.blob(v)) for s, c, v in members])
        txn.executemany("INSERT INTO prada_dist(key, seq, d) VALUES (?, ?, ?)",
                        [(key, len(dists) - len(window) + i, d) for i, d in enumerate(window)])
        txn.execute("INSERT INTO prada_state(key, version, dim, member_seq, nd, window_start, queries, tested_at, "
                    "lows, highs, last_w, flagged_at, flag_time, flags, stats, updated) "
                    "VALUES (?, 1, ?, ?, ?, 0, ?, ?, 0, 0, NULL, ?, ?, ?, ?, ?)",
                    (key, dim, len(members), len(dists), len(rows), len(dists),
                     None if flag is None else flag[0], None if flag is None else flag[1], 0 if flag is None else 1,
                     _stats_json(stats), txn.store.clock()))
    txn.execute("DROP TABLE prada_events")


def _stats_json(stats: dict) -> str:
    import json

    return json.dumps({str(c): [s.threshold, s.n, s.s, s.ss] for c, s in sorted(stats.items())})


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "query log, usage, operator keys, watermark marks, detector flags", (
        "CREATE TABLE IF NOT EXISTS usage (key_name TEXT PRIMARY KEY, used {int} NOT NULL)",
        "CREATE TABLE IF NOT EXISTS queries (id {serial_pk}, ts {real}, key_name TEXT, rows {int}, status {int}, "
        "code TEXT, max_l1 {real}, ms {real})",
        _add_column("queries", "request_id", "TEXT"),
        "CREATE INDEX IF NOT EXISTS queries_ts ON queries(ts)",
        "CREATE TABLE IF NOT EXISTS api_keys (name TEXT PRIMARY KEY, key_sha256 TEXT UNIQUE, budget {int}, "
        "revoked {int} NOT NULL DEFAULT 0, created {real})",
        "CREATE TABLE IF NOT EXISTS marks (digest {blob} PRIMARY KEY, key TEXT, time {real}, shape TEXT, x {blob}, "
        "mark {int}, top1 {int})",
        "CREATE TABLE IF NOT EXISTS prada_flags (key TEXT PRIMARY KEY, flagged_at {int}, shapiro_w {real}, "
        "time {real})",
    )),
    Migration(2, "service clock for retention (clock jumps and downtime never expire rows)", (
        _add_column("queries", "svc_time", "{real}"),
        _service_clock_from_wall_clock,
        "CREATE INDEX IF NOT EXISTS queries_svc_time ON queries(svc_time)",
    )),
    Migration(3, "bounded detector state per key (replaces the per-row event log)", (
        "CREATE TABLE IF NOT EXISTS prada_state (key TEXT PRIMARY KEY, version {int} NOT NULL, dim {int}, "
        "member_seq {int}, nd {int}, window_start {int}, queries {int}, tested_at {int}, lows {int}, highs {int}, "
        "last_w {real}, flagged_at {int}, flag_time {real}, flags {int}, stats TEXT, updated {real})",
        "CREATE TABLE IF NOT EXISTS prada_members (key TEXT, seq {int}, cls {int}, vec {blob}, PRIMARY KEY (key, seq))",
        "CREATE TABLE IF NOT EXISTS prada_dist (key TEXT, seq {int}, d {real}, PRIMARY KEY (key, seq))",
        "CREATE INDEX IF NOT EXISTS prada_state_updated ON prada_state(updated)",
        _convert_prada_events,
    )),
    Migration(4, "settings shared by the replicas of one store", (
        "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    )),
)

LATEST = MIGRATIONS[-1].version
