"""Bounded coverage of the audit log (issue 26 item 5): the anchor exchange covers every record — refusals,
fetches, malformed-message records written after the last step — so deleting or rewriting one is caught."""

import shutil
import sqlite3
import threading
import time

import pytest

from modelward.governance.audit import ANCHOR_OP, AnchorLoop, AuditError, AuditLog, verify, verify_against


@pytest.fixture()
def pair(tmp_path):
    alice, bob = AuditLog(tmp_path / "alice.db", "alice"), AuditLog(tmp_path / "bob.db", "bob")
    yield alice, bob
    alice.close()
    bob.close()


def exchange(alice: AuditLog, bob: AuditLog) -> None:
    """One anchor exchange, alice (the previous party) offering."""
    answer = bob.anchor_accept("alice", alice.anchor_offer())
    alice.anchor_settle("bob", answer)


def _train(alice, bob, steps=3):
    """Steps whose heads travel with the messages, as the parties do."""
    for s in range(steps):
        a = alice.append("driver", "step", "s", s, s + 1, 32)
        bob.append("alice", "step", "s", s, s + 1, 32, anchors={"alice": [alice.last_id, a]})
        alice.append("driver", "commit", "s", s, anchors={"bob": bob.head_ref})


def _snapshot(tmp_path, log: AuditLog, name: str):
    dst = tmp_path / name
    src = sqlite3.connect(log.path)
    out = sqlite3.connect(dst)
    src.backup(out)
    src.close()
    out.close()
    return dst


def test_records_after_the_last_step_are_covered_by_the_exchange(pair, tmp_path):
    alice, bob = pair
    _train(alice, bob)
    # after training: a refused fetch, a malformed message and an allowed fetch on bob; nothing anchors them yet
    bob.append("alice", "fetch", decision="deny", reason="bob keeps its outputs")
    bob.append("mallory", "(malformed)", decision="deny", reason="truncated")
    bob.append("alice", "fetch", decision="allow")
    tail = bob.last_id
    assert bob.anchored["alice"] == alice.last_id - 1 and alice.anchored["bob"] < tail
    exchange(alice, bob)
    assert alice.anchored["bob"] >= tail  # every one of bob's decisions is now in alice's log
    bob_copy, alice_copy = _snapshot(tmp_path, bob, "b.db"), _snapshot(tmp_path, alice, "a.db")
    assert verify_against(bob_copy, alice_copy).ok
    db = sqlite3.connect(bob_copy)  # bob deletes the refusals written after the last step
    db.execute("DELETE FROM audit WHERE id > ?", (tail - 3,))
    db.commit()
    db.close()
    assert verify(bob_copy).ok  # the chain itself is intact ...
    r = verify_against(bob_copy, alice_copy)
    assert not r.ok and "truncated" in r.problem  # ... but alice's log anchors what was cut
    # rewriting instead (delete the tail, append other records with the same ids): a different hash
    shutil.copy(_snapshot(tmp_path, bob, "b2.db"), tmp_path / "b3.db")
    db = sqlite3.connect(tmp_path / "b3.db")
    db.execute("DELETE FROM audit WHERE id > ?", (tail - 3,))
    db.commit()
    db.close()
    forged = AuditLog(tmp_path / "b3.db", "bob")
    for _ in range(4):
        forged.append("alice", "fetch", decision="allow", reason="nothing refused here")
    forged.close()
    r = verify_against(tmp_path / "b3.db", alice_copy)
    assert not r.ok and "rewritten" in r.problem


def test_alice_s_own_tail_is_covered_in_bob_s_log(pair, tmp_path):
    alice, bob = pair
    _train(alice, bob)
    alice.append("eve", "(identity)", decision="deny", reason="unpinned")
    exchange(alice, bob)
    assert bob.anchored["alice"] >= alice.decision_id
    a, b = _snapshot(tmp_path, alice, "a.db"), _snapshot(tmp_path, bob, "b.db")
    db = sqlite3.connect(a)
    db.execute("DELETE FROM audit WHERE op = '(identity)' OR id > (SELECT MIN(id) FROM audit WHERE op = "
               "'(identity)')")
    db.commit()
    db.close()
    assert not verify_against(a, b).ok


def test_an_idle_exchange_writes_nothing(pair):
    alice, bob = pair
    _train(alice, bob)
    exchange(alice, bob)
    n = (alice.last_id, bob.last_id)
    for _ in range(5):
        exchange(alice, bob)
    assert (alice.last_id, bob.last_id) == n  # no ping-pong of anchor records
    bob.append("alice", "fetch", decision="deny")
    exchange(alice, bob)
    assert bob.last_id == n[1] + 1 and alice.last_id == n[0] + 1  # one record on alice's side only
    assert alice.decision_id < alice.last_id  # (an anchor record is not a decision)
    row = sqlite3.connect(alice.path).execute("SELECT op FROM audit ORDER BY id DESC LIMIT 1").fetchone()
    assert row[0] == ANCHOR_OP


def test_the_state_comes_back_from_the_log_after_a_restart(tmp_path):
    alice, bob = AuditLog(tmp_path / "a.db", "alice"), AuditLog(tmp_path / "b.db", "bob")
    _train(alice, bob)
    exchange(alice, bob)
    anchored, decision = bob.anchored.copy(), bob.decision_id
    bob.close()
    bob = AuditLog(tmp_path / "b.db", "bob")
    assert bob.anchored == anchored and bob.decision_id == decision
    n = bob.last_id
    exchange(alice, bob)
    assert bob.last_id == n  # nothing new: still nothing written
    alice.close()
    bob.close()


def test_a_malformed_offer_is_refused(pair):
    _, bob = pair
    for bad in (None, {"head": [1, "x"], "decision": 1}, {"head": [1, "0" * 64], "decision": 5},
                {"head": [True, "0" * 64], "decision": 0}, {"head": [3, "0" * 64]}):
        with pytest.raises(AuditError, match="anchor offer"):
            bob.anchor_accept("alice", bad)


def test_the_loop_anchors_within_its_period(pair):
    alice, bob = pair
    _train(alice, bob)
    lock = threading.Lock()

    def locked():
        with lock:
            exchange(alice, bob)

    loop = AnchorLoop(0.05, locked)
    try:
        bob.append("alice", "fetch", decision="deny")
        target = bob.decision_id
        deadline = time.monotonic() + 5
        while alice.anchored.get("bob", 0) < target and time.monotonic() < deadline:
            time.sleep(0.02)
        assert alice.anchored["bob"] >= target
    finally:
        loop.close()
    assert loop.failures == 0
