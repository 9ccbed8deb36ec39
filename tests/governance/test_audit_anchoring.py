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


# ---------------------------------------------------------------------------------------------------- Anchoring
def test_an_announced_address_is_checked_and_bound_to_its_host():
    from modelward.governance.audit import announced_address

    assert announced_address("10.0.0.5:50062") == "10.0.0.5:50062"
    assert announced_address("0.0.0.0:41000", known="b.example.org:50062") == "b.example.org:41000"
    assert announced_address("[::]:41000", known="127.0.0.1:5") == "127.0.0.1:41000"
    for bad in (None, 5, "", "host", "host:0", "host:70000", "a b:1", "x" * 300 + ":1", "0.0.0.0:41000"):
        assert announced_address(bad) is None, bad


class _Net:
    """Who answers where: address -> a neighbour's log (it answers as that neighbour), or an exception."""

    def __init__(self):
        self.at: dict = {}
        self.calls: list[str] = []

    def call(self, name, address, meta, timeout):
        self.calls.append(address)
        who = self.at.get(address)
        if who is None:
            from modelward.governance.protocol import PartyUnavailable
            raise PartyUnavailable(f"nothing at {address}")
        if isinstance(who, Exception):
            raise who
        return who.accept("alice", meta)


def test_a_neighbour_is_followed_only_to_an_address_where_it_proves_itself(tmp_path):
    from modelward.errors import IdentityError
    from modelward.governance.audit import Anchoring

    alice_log, bob_log = AuditLog(tmp_path / "a.db", "alice"), AuditLog(tmp_path / "b.db", "bob")
    bob = Anchoring(bob_log, {}, None, lambda: "127.0.0.1:2000", every_s=3600)
    net, moved = _Net(), []
    net.at["127.0.0.1:1000"] = bob
    alice = Anchoring(alice_log, {"bob": "127.0.0.1:1000"}, net.call, lambda: "127.0.0.1:3000", every_s=3600,
                      store=tmp_path / "neighbours.json", on_switch=lambda n, a: moved.append((n, a)))
    try:
        bob_log.append("alice", "fetch", decision="deny")
        alice.run()
        assert alice_log.anchored["bob"] >= bob_log.decision_id and moved == []
        # bob answers with where it listens (2000): heard, but the working address is kept
        assert alice.heard["bob"] == ["127.0.0.1:2000"] and alice.where("bob") == "127.0.0.1:1000"
        # a wrong address given (as by bob's own key): tried only once 1000 fails, refused there, audited
        alice.accept("bob", {"offer": bob_log.anchor_offer(), "address": "127.0.0.1:6666"})
        net.at["127.0.0.1:6666"] = IdentityError("the server at 127.0.0.1:6666 is party 'alice', not 'bob'")
        del net.at["127.0.0.1:1000"]  # bob moved to 2000
        net.at["127.0.0.1:2000"] = bob
        bob_log.append("alice", "fetch", decision="deny")
        alice.run()
        assert net.calls[-3:] == ["127.0.0.1:1000", "127.0.0.1:6666", "127.0.0.1:2000"]
        assert alice.where("bob") == "127.0.0.1:2000" and moved == [("bob", "127.0.0.1:2000")]
        assert alice_log.anchored["bob"] >= bob_log.decision_id
        assert "127.0.0.1:6666" not in alice.heard["bob"]  # never tried again
        assert alice_log.count(("(address)",), decision="deny") == 1
        # the proven address survives a restart
        again = Anchoring(alice_log, {"bob": "127.0.0.1:1000"}, net.call, lambda: None, every_s=3600,
                          store=tmp_path / "neighbours.json")
        assert again.where("bob") == "127.0.0.1:2000"
        again.close(final_timeout=1.0)
    finally:
        alice.close(final_timeout=1.0)
        alice_log.close()
        bob_log.close()


def test_a_poke_and_a_clean_stop_each_run_an_exchange(tmp_path):
    from modelward.governance.audit import Anchoring

    alice_log, bob_log = AuditLog(tmp_path / "a.db", "alice"), AuditLog(tmp_path / "b.db", "bob")
    bob = Anchoring(bob_log, {}, None, lambda: None)
    net = _Net()
    net.at["b:1"] = bob
    alice = Anchoring(alice_log, {"bob": "b:1"}, net.call, lambda: None, every_s=3600)
    try:
        bob_log.append("alice", "fetch", decision="deny")
        alice.poke()  # (the party pokes after a refusal; the period is an hour here)
        deadline = time.monotonic() + 5
        while alice_log.anchored.get("bob", 0) < bob_log.decision_id and time.monotonic() < deadline:
            time.sleep(0.02)
        assert alice_log.anchored["bob"] >= bob_log.decision_id
        bob_log.append("alice", "fetch", decision="deny")
        alice.close(final_timeout=1.0)  # the last round on the way out
        assert alice_log.anchored["bob"] >= bob_log.decision_id
    finally:
        alice.close()
        alice_log.close()
        bob_log.close()
