"""One conformance suite for the guard's store, run against both implementations (as SQLAlchemy's dialect tests
are): the embedded SQLite store and a real PostgreSQL server started for this module (skipped, with the reason on
one line, where none can be had). Budgets exact under concurrent connections, transactions all-or-nothing, the
detector's state shared through the store, retention on serving time, versioned migrations (issue #40 item 2,
issue #37 items 2 and 7)."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from modelward.errors import ConfigError
from modelward.extraction.guard.errors import BudgetExceeded, WouldBlock
from modelward.extraction.guard.store import SQLStore, open_store
from modelward.extraction.guard.store.migrations import LATEST
from modelward.extraction.guard.store.pgtest import find_postgres, fresh_database, throwaway_postgres
from modelward.extraction.ownership.detector import PradaDetector


@pytest.fixture(scope="module")
def pg_server():
    found = find_postgres()
    if isinstance(found, str):
        pytest.skip(f"no PostgreSQL server for the store conformance tests: {found}")
    with throwaway_postgres() as url:
        yield url


_count = iter(range(10**6))


@pytest.fixture(params=["sqlite", "postgres"])
def make_store(request, tmp_path):
    """``make_store(**kw)`` opens a new connection to one store (several calls: several processes' connections)."""
    opened: list[SQLStore] = []
    if request.param == "postgres":
        url = fresh_database(request.getfixturevalue("pg_server"), f"conf{next(_count)}")
    else:
        url = None

    def make(**kw) -> SQLStore:
        s = open_store(url, tmp_path / "queries.sqlite", **kw)
        opened.append(s)
        return s

    yield make
    for s in opened:
        try:
            s.close()
        except Exception:  # noqa: BLE001 - closed by the test
            pass


def test_budgets_are_exact_under_concurrent_connections(make_store):
    stores = [make_store(busy_timeout=20.0) for _ in range(4)]  # four "replicas"
    ok = [0] * 4
    refused = [0] * 4

    def client(i: int) -> None:
        for _ in range(15):
            try:
                with stores[i].transaction() as txn:
                    txn.charge("shared", 3, budget=100)
                    txn.log("shared", 3, 200, "ok", 0.0, 1.0)
                ok[i] += 1
            except BudgetExceeded:
                refused[i] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sum(ok) == 33 and sum(refused) == 60 - 33  # 33 × 3 = 99 ≤ 100: charged once, answered once
    assert stores[0].used("shared") == 99
    rows = stores[0].db.execute(stores[0].dialect.sql("SELECT COUNT(*), SUM(rows) FROM queries WHERE code = ?"),
                                ("ok",)).fetchone()
    assert (int(rows[0]), int(rows[1])) == (33, 99)


def test_a_transaction_commits_everything_or_nothing(make_store):
    s = make_store()
    table = "centroids_m_modelguard_s"
    s.centroids_from(table, 0, 3)  # creates the table
    det = PradaDetector(min_queries=5)
    with pytest.raises(RuntimeError, match="injected"):
        with s.transaction() as txn:
            txn.charge("k", 4, budget=10)
            txn.append_centroids(table, 0, np.array([1]), np.array([[0.2, 0.5, 0.3]]))
            txn.insert_marks([(b"d" * 32, "k", 1.0, "4", b"\0" * 16, 1, 0)])
            txn.write_detector(det.prepare("k", torch.rand(4, 4), torch.zeros(4, dtype=torch.long)), 1000)
            txn.log("k", 4, 200, "ok", 0.1, 1.0)
            raise RuntimeError("injected")
    assert s.used("k") == 0 and s.marked_rows() == 0 and len(s.centroids_from(table, 0, 3)[0]) == 0
    assert s.detector_rows() == {"prada_state": 0, "prada_members": 0, "prada_dist": 0}
    assert s.load_detector_state("k") is None


def test_the_detector_state_round_trips_and_another_connection_sees_each_update(make_store):
    a, b = make_store(), make_store()
    da, db_ = PradaDetector(min_queries=20, window=60), PradaDetector(min_queries=20, window=60)
    g = torch.Generator().manual_seed(0)
    for i in range(12):  # the key's batches alternate between two "replicas"
        det, store = (da, a) if i % 2 == 0 else (db_, b)
        x = torch.rand(16, 6, generator=g)
        y = (x[:, 0] * 3).long()
        with store.transaction() as txn:
            det.state("k") if False else None  # noqa: B018 - (the guard reads through its loader, below)
            cached = det.cached("k")
            fresh = txn.detector_state("k", cached)
            if fresh is not None and fresh is not cached:
                det._put("k", fresh)
            up = det.prepare("k", x, y)
            txn.write_detector(up, det.window)
        det.apply(up)
    mine, theirs = db_.cached("k"), a.load_detector_state("k")
    assert theirs.version == mine.version == 12 and theirs.queries == mine.queries == 192
    assert np.array_equal(theirs.window, mine.window) and len(mine.window) <= 60
    assert theirs.member_seq == mine.member_seq and theirs.stats == mine.stats
    for c, m in mine.members.items():
        assert np.array_equal(theirs.members[c].rows, m.rows)
    rows = a.detector_rows()
    assert rows["prada_dist"] <= 60 and rows["prada_members"] == mine.member_seq  # bounded in the store too


def test_centroids_repair_gaps_and_replicas_see_each_others(make_store):
    a, b = make_store(), make_store()
    table = "centroids_m_modelguard_s"
    a.centroids_from(table, 0, 2)
    with a.transaction() as txn:
        assert len(txn.sync_centroids(table, 0, 2)[0]) == 0
        txn.append_centroids(table, 0, np.array([0, 1]), np.array([[0.9, 0.1], [0.2, 0.8]]))
    with b.transaction() as txn:
        labels, vecs = txn.sync_centroids(table, 0, 2)
    if b.shared:  # the other replica's centroids, in order
        assert labels.tolist() == [0, 1] and np.allclose(vecs[1], [0.2, 0.8])
    else:  # one writer: nothing to catch up on
        assert len(labels) == 0
    with a.transaction() as txn:
        txn.execute(f"DELETE FROM {table} WHERE seq = 0")  # a gap left by an older version
    labels, _ = a.centroids_from(table, 0, 2)
    assert labels.tolist() == [1]


def test_retention_counts_serving_time_not_the_wall_clock(make_store, monkeypatch):
    s = make_store(retention_days=30)
    for _ in range(5):
        s.log("k", 1, 200, "ok", 0.0, 1.0)
    with s.transaction() as txn:  # three rows were written 40 days of serving ago
        txn.execute("UPDATE queries SET svc_time = svc_time - 40 * 86400 WHERE id <= 3")
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 40 * 86400)  # and the clock jumps 40 days ahead
    assert s.prune() == 3
    s.close()
    s = make_store(retention_days=30)  # a restart with the jumped clock deletes nothing more
    assert int(s.db.execute(s.dialect.sql("SELECT COUNT(*) FROM queries")).fetchone()[0]) == 2
    assert s.clock() < real() + 86400  # serving time continues from the newest row, not the jumped clock


def test_keys_usage_and_pinned_settings(make_store):
    s = make_store()
    s.add_key("analyst", "mw-secret", 10)
    s.revoke_key("config-key")
    keys = {k.name: k for k in s.stored_keys()}
    assert keys["analyst"].budget == 10 and not keys["analyst"].revoked and keys["config-key"].revoked
    assert "mw-secret" not in str(keys)
    s.reserve("analyst", 7, 10)
    with pytest.raises(BudgetExceeded):
        s.reserve("analyst", 7, 10)
    s.reset_usage("analyst")
    assert s.usage()["analyst"] == 0
    assert s.pin("state", "a") is None and s.pin("state", "b") == "a"
    assert s.schema_version() == LATEST


def test_a_refusal_is_logged_without_waiting_for_a_locked_store(tmp_path):
    s = open_store(None, tmp_path / "q.sqlite", busy_timeout=5.0)
    lock = sqlite3.connect(str(tmp_path / "q.sqlite"), isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")  # an operator's shell holds the write lock
    t0 = time.monotonic()
    s.log("k", 4, 503, "store_busy", None, 5000.0)
    assert time.monotonic() - t0 < 1.5  # not another busy timeout: the row waits in memory
    lock.execute("ROLLBACK")
    lock.close()
    s.reserve("k", 1, None)  # the next transaction writes it
    assert s.db.execute("SELECT code FROM queries").fetchall() == [("store_busy",)]
    s.close()


def test_a_refusal_logged_from_the_event_loop_never_waits_and_loses_nothing(tmp_path):
    """Issue 37: the HTTP layer logs a refusal (a spent key's 429) on the event loop with ``wait=False``: one
    committed INSERT when the store is free; WouldBlock with nothing written (the caller then logs it from a worker
    thread) when this store's lock or the database's write lock is held — never a wait on the loop."""
    s = open_store(None, tmp_path / "q.sqlite", busy_timeout=5.0)
    s.log("k", 16, 429, "query_budget_exceeded", None, 0.2, "r1", wait=False)
    other = sqlite3.connect(str(tmp_path / "q.sqlite"), isolation_level=None)
    # committed: another connection (another process) sees the row at once
    assert other.execute("SELECT key_name, rows, status, request_id FROM queries").fetchall() == [
        ("k", 16, 429, "r1")]
    other.execute("BEGIN IMMEDIATE")  # an operator's shell holds the write lock
    with pytest.raises(WouldBlock):
        s.log("k", 16, 429, "query_budget_exceeded", None, 0.2, "r2", wait=False)
    other.execute("ROLLBACK")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # another request's transaction of this store, in a worker thread
        with s.transaction():
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    with pytest.raises(WouldBlock):
        s.log("k", 16, 429, "query_budget_exceeded", None, 0.2, "r3", wait=False)
    release.set()
    t.join()
    s.log("k", 16, 429, "query_budget_exceeded", None, 0.2, "r3")  # the worker thread's retry
    assert [r[0] for r in other.execute("SELECT request_id FROM queries ORDER BY id")] == ["r1", "r3"]
    other.close()
    s.close()


def test_an_old_store_is_migrated_and_a_newer_one_refused(tmp_path):
    path = tmp_path / "queries.sqlite"
    db = sqlite3.connect(str(path))
    db.executescript("""
        CREATE TABLE usage (key_name TEXT PRIMARY KEY, used INTEGER NOT NULL);
        CREATE TABLE queries (id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL, key_name TEXT, rows INTEGER,
                              status INTEGER, code TEXT, max_l1 REAL, ms REAL);
        CREATE TABLE prada_events (key TEXT, seq INTEGER, cls INTEGER, d_min REAL, admitted INTEGER,
                                   batch_end INTEGER, vec BLOB, PRIMARY KEY (key, seq));
        CREATE TABLE prada_flags (key TEXT PRIMARY KEY, flagged_at INTEGER, shapiro_w REAL, time REAL);
        INSERT INTO usage VALUES ('k', 12);
        INSERT INTO queries(ts, key_name, rows, status, code) VALUES (1000.0, 'k', 12, 200, 'ok');
    """)
    vec = np.ones(4, dtype="<f4").tobytes()
    db.executemany("INSERT INTO prada_events VALUES (?, ?, ?, ?, ?, 0, ?)",
                   [("k", 0, 1, None, 1, vec), ("k", 1, 1, 0.5, 1, vec), ("k", 2, 1, 0.2, 0, None)])
    db.commit()
    db.close()
    s = open_store(None, path)
    assert s.schema_version() == LATEST and s.used("k") == 12
    st = s.load_detector_state("k")
    assert st.queries == 3 and st.member_seq == 2 and np.allclose(np.exp(st.window), [0.5, 0.2])
    assert "prada_events" not in {r[0] for r in s.db.execute("SELECT name FROM sqlite_master")}
    s.db.execute("INSERT INTO schema_version(version) VALUES (?)", (LATEST + 1,))
    s.close()
    with pytest.raises(ConfigError, match="newer"):
        open_store(None, Path(path))


def test_a_servers_wal_checkpoints_run_in_their_own_thread_not_in_the_commits(tmp_path):
    """guard-perf3: SQLite checkpoints its WAL inside the commit that fills 1,000 pages (an fsync on the request
    path: the guard's p99). With the checkpointer started no commit does (below its 64 MiB fallback), and the
    thread copies what was committed into the database file."""
    from modelward.extraction.guard.store.sqlite import FALLBACK_AUTOCHECKPOINT

    def in_the_file(path: Path) -> int:  # the database file alone, without its WAL (no locks: read it again
        db = sqlite3.connect(f"file:{path}?immutable=1", uri=True)  # when the checkpointer was writing it)
        try:
            row = db.execute("SELECT used FROM usage WHERE key_name = 'alice'").fetchone()
        except sqlite3.OperationalError:  # not even the tables made it to the file
            row = None
        except sqlite3.DatabaseError:  # a page read while the thread was writing it
            return -1
        finally:
            db.close()
        return row[0] if row else 0

    blob = bytes(4000)  # about a page per row: 1,200 commits checkpoint in a commit at 1,000 without the thread
    for every, name in ((3600.0, "idle.sqlite"), (0.05, "q.sqlite")):  # a thread that does not run yet, and one
        store = open_store(None, tmp_path / name)
        try:
            store.start_checkpointer(every=every)
            assert store.db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == FALLBACK_AUTOCHECKPOINT
            for i in range(1200):
                with store.transaction() as txn:
                    txn.charge("alice", 1, None)
                    txn.execute("INSERT INTO marks(digest, key, time, shape, x, mark, top1) VALUES (?, ?, ?, ?, ?, ?, "
                                "?)", (i.to_bytes(32, "big"), "alice", float(i), "1000", blob, 0, 0))
            if every > 60:  # no commit checkpointed: the WAL holds every page, the file none of the rows
                assert (tmp_path / f"{name}-wal").stat().st_size > 1200 * 4096 and in_the_file(tmp_path / name) == 0
            else:
                deadline = time.monotonic() + 10
                while in_the_file(tmp_path / name) != 1200 and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert in_the_file(tmp_path / name) == 1200  # the thread checkpointed everything
            assert store.used("alice") == 1200
        finally:
            store.close()
        assert store._checkpointer is None  # stopped and joined by close
