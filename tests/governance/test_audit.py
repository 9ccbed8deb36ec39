import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from modelward.governance.audit import AuditError, AuditLog, verify


@pytest.fixture()
def log(tmp_path):
    a = AuditLog(tmp_path / "audit.db", "bob")
    for i in range(6):
        a.append("alice", "forward", "s1", i, i + 1, 32, {"h": [32, 16]}, "allow", "policy")
    head = a.head
    a.close()
    return tmp_path / "audit.db", head


def _sql(path, q, *args):
    db = sqlite3.connect(path)
    db.execute(q, args)
    db.commit()
    db.close()


def test_intact_log_verifies_and_reopens_with_same_head(log):
    path, head = log
    r = verify(path, expect_head=head)
    assert r.ok and r.records == 6 and "OK" in str(r)
    a = AuditLog(path, "bob")
    assert a.head == head
    a.append("alice", "backward", "s1", 6, 7, 32)
    a.close()
    assert verify(path).ok


def test_edited_record_is_found(log):
    path, _ = log
    _sql(path, "UPDATE audit SET decision='deny' WHERE id=3")
    r = verify(path)
    assert not r.ok and r.bad_id == 3 and "edited" in r.problem


def test_deleted_record_is_found(log):
    path, _ = log
    _sql(path, "DELETE FROM audit WHERE id=4")
    r = verify(path)
    assert not r.ok and r.bad_id == 5 and "deleted" in r.problem


def test_reordered_records_are_found(log):
    path, _ = log
    db = sqlite3.connect(path)
    rows = db.execute("SELECT * FROM audit WHERE id IN (2,3) ORDER BY id").fetchall()
    db.execute("DELETE FROM audit WHERE id IN (2,3)")
    for row, new_id in zip(rows, (3, 2), strict=True):
        db.execute(f"INSERT INTO audit VALUES ({','.join('?' * len(row))})", (new_id, *row[1:]))
    db.commit()
    db.close()
    r = verify(path)
    assert not r.ok and r.bad_id == 2


def test_inserted_record_is_found(log):
    path, _ = log
    db = sqlite3.connect(path)
    db.execute("UPDATE audit SET id = id + 100 WHERE id >= 4")
    db.execute("UPDATE audit SET id = id - 99 WHERE id >= 100")
    row = list(db.execute("SELECT * FROM audit WHERE id=3").fetchone())
    row[0] = 4
    db.execute(f"INSERT INTO audit VALUES ({','.join('?' * len(row))})", row)
    db.commit()
    db.close()
    r = verify(path)
    assert not r.ok and r.bad_id == 4


def test_truncated_tail_needs_the_published_head(log):
    path, head = log
    _sql(path, "DELETE FROM audit WHERE id=6")
    assert verify(path).ok  # a chain cut at the end is still a chain ...
    r = verify(path, expect_head=head)  # ... but not the one the party published
    assert not r.ok and "published head" in r.problem


def test_missing_or_foreign_file(tmp_path):
    with pytest.raises(AuditError, match="not found"):
        verify(tmp_path / "nope.db")
    (tmp_path / "x.db").write_text("hello")
    with pytest.raises(AuditError, match="not a modelward audit log"):
        verify(tmp_path / "x.db")


def test_records_appended_after_the_published_head_are_not_tampering(log):
    # UAT: `split predict` appends inference records after summary.json's head was published; verifying the
    # log with that head must still pass, and a truncation below it must still fail.
    path, head = log
    a = AuditLog(path, "bob")
    a.append("alice", "infer", "s2", 0, 1, 32)
    a.close()
    r = verify(path, expect_head=head)
    assert r.ok and r.head_at == 6 and "1 record(s) appended" in str(r)
    assert verify(path, expect_head=head[:16]).ok  # the prefix `audit verify` prints is enough
    _sql(path, "DELETE FROM audit WHERE id>=6")
    assert not verify(path, expect_head=head).ok


def test_malformed_published_head_is_a_usage_error(log):
    path, _ = log
    with pytest.raises(AuditError, match="--head"):
        verify(path, expect_head="abc")


def _anchored_pair(tmp_path, n=6):
    bob, alice = AuditLog(tmp_path / "bob.db", "bob"), AuditLog(tmp_path / "alice.db", "alice")
    for i in range(n):
        bob.append("carol", "step", "s", i, i + 1, 32, purpose="train")
        alice.append("alice", "step", "s", i, i + 1, 32, purpose="train", anchors={"bob": bob.head_ref})
    bob.close()
    alice.close()
    return tmp_path / "bob.db", tmp_path / "alice.db"


def test_verify_against_catches_a_truncated_or_rewritten_tail(tmp_path):
    from modelward.governance.audit import head_of, verify_against

    bob, alice = _anchored_pair(tmp_path)
    r = verify_against(bob, alice)
    assert r.ok and "6 head(s)" in str(r) and "latest anchored record is 6" in str(r)
    assert head_of(bob)["records"] == 6 and head_of(bob)["party"] == "bob"
    _sql(bob, "DELETE FROM audit WHERE id > 4")  # still a valid chain on its own
    assert verify(bob).ok
    r = verify_against(bob, alice)
    assert not r.ok and r.bad_id == 5 and "truncated" in r.problem
    log = AuditLog(bob, "bob")  # ... and re-written: same ids, different content
    for i in (4, 5):
        log.append("carol", "step", "s", i, i + 1, 1, purpose="train")
    log.close()
    r = verify_against(bob, alice)
    assert not r.ok and r.bad_id == 5 and "rewritten" in r.problem


def test_refusals_are_rate_limited_and_counted(tmp_path):
    a = AuditLog(tmp_path / "a.db", "bob")
    assert a.refusal("mallory", "(identity)", "not pinned", every_s=60)
    assert not any(a.refusal("mallory", "(identity)", "not pinned", every_s=60) for _ in range(5))
    assert a.refusal("eve", "(identity)", "not pinned", every_s=60)  # per peer
    assert a.refusal("mallory", "(identity)", "not pinned", every_s=0)
    rows = a.db.execute("SELECT caller, decision, reason FROM audit").fetchall()
    a.close()
    assert len(rows) == 3 and rows[-1][2].startswith("not pinned (5 similar")


@pytest.mark.skipif(sys.platform != "linux", reason="kill -9 semantics")
def test_records_written_in_the_background_survive_kill_9(tmp_path):
    """A data pass's record is synced to disk in the background, but it is in the log before the answer leaves:
    killing the process right after the append loses nothing."""
    db = tmp_path / "audit.db"
    code = textwrap.dedent(f"""
        import os, signal
        from modelward.governance.audit import AuditLog
        log = AuditLog({str(db)!r}, "bob")
        for i in range(50):
            log.append("alice", "step", "s", i, i + 1, 32, durable=False)
        print(log.head, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")})
    assert r.returncode == -9, r.stderr
    res = verify(db, expect_head=r.stdout.strip())
    assert res.ok and res.records == 50 and res.head_at == 50, res


def test_sync_and_close_make_background_records_durable(tmp_path):
    log = AuditLog(tmp_path / "audit.db", "bob")
    for i in range(5):
        log.append("alice", "step", "s", i, i + 1, 32, durable=False)
    log.sync()
    assert log._synced == log.last_id == 5  # every record appended so far is on stable storage
    log.append("alice", "step", "s", 5, 6, 32, durable=False)
    log.close()
    log.close()  # idempotent
    assert verify(tmp_path / "audit.db").records == 6
