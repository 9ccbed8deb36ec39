"""Revocation (issue #27): a deny-list of pinned certificate fingerprints checked on every request, before the
body is decoded; `party revoke NAME` puts a peer's pin on it and a running party refuses that peer from its next
request on (within one step), with an audit record."""

from __future__ import annotations

import threading

import pytest

from modelward.core.train import TrainConfig
from modelward.errors import ConfigError
from modelward.governance.audit import AuditLog
from modelward.governance.consent import ConsentChecker, Policy
from modelward.governance.party import gate as g
from modelward.governance.party.config import load_party_config, revoke_peer, revoked_path
from modelward.governance.party.gate import Gate, Request
from modelward.governance.protocol import ConsentDenied
from modelward.governance.trust.revocation import DenyList, revoke
from modelward.governance.wire import Message

FP_A = "sha256:" + "a" * 64
FP_B = "sha256:" + "b" * 64


class Stub:
    def __init__(self) -> None:
        self.seen: list[Request] = []

    def __call__(self, req: Request) -> bytes:
        self.seen.append(req)
        return b"answer"


class Handler:
    note = ""

    def settle(self) -> None: ...

    def dispatch(self, op, msg, caller):  # pragma: no cover - the check under test never reaches it
        raise AssertionError


def test_the_deny_list_is_reread_when_it_changes_and_refuses_before_decoding(tmp_path):
    deny = DenyList(tmp_path / "revoked.txt")
    log = AuditLog(tmp_path / "audit.db", "bob")
    pins = {"alice": FP_A, "driver": FP_B}
    gate = Gate(Handler(), name="bob", driver="driver", prev="alice", audit=log,
                consent=ConsentChecker(Policy(allow_peers=["alice", "driver"]), log), lock=threading.RLock(),
                refusals_every_s=0.0, revoked=lambda caller: deny.reason(pins.get(caller)))
    nxt = Stub()
    req = Request("alice", b"\x00garbage")
    assert g.peer_pin(gate, req, nxt) == b"answer" and nxt.seen == [req]  # no file: nobody is revoked
    assert revoke(deny.path, FP_A.upper().replace("SHA256", "sha256"), "alice") is True
    assert revoke(deny.path, FP_A, "alice") is False  # (normalised: the same pin twice is one entry)
    with pytest.raises(ConsentDenied, match="'alice' is refused: certificate sha256:a+ is revoked \\(alice, "):
        g.peer_pin(gate, Request("alice", b"\x00garbage"), nxt)
    assert len(nxt.seen) == 1  # the refused request never reached the next check
    row = log.db.execute("SELECT caller, op, decision, reason FROM audit ORDER BY id DESC LIMIT 1").fetchone()
    assert row[:3] == ("alice", "(revoked)", "deny") and FP_A in row[3]
    assert g.peer_pin(gate, Request("driver", b"x"), nxt) == b"answer"  # only the revoked pin is refused
    deny.path.write_text(deny.path.read_text() + "not-a-fingerprint\n")
    with pytest.raises(ConfigError, match="revoked.txt:2"):  # a malformed list fails closed, naming the line
        g.peer_pin(gate, Request("driver", b"x"), nxt)
    assert len(nxt.seen) == 2
    log.close()


def test_a_peer_revoked_mid_training_is_refused_at_its_next_step_and_audited(make_chain):
    c = make_chain(driver="operator")
    tc = TrainConfig(steps=6, eval_every=3, batch_size=16, eval_batch_size=128, lr=0.05)
    bob_cfg = load_party_config(c.split.party_configs["bob"])
    with pytest.raises(ConfigError, match="'mallory' is not a pinned peer"):
        revoke_peer(bob_cfg, "mallory")
    done: list[int] = []

    def on_step(step, loss, links):
        done.append(step)
        if step == 2:  # bob's organisation revokes alice while the session runs
            path, fp, added = revoke_peer(bob_cfg, "alice")
            assert added and path == revoked_path(bob_cfg) and fp == c.parties["bob"].pins["alice"]

    with c.driver(tc) as drv:
        drv.cfg.retry_s = 0.0
        with pytest.raises(ConsentDenied, match="'alice' is refused: certificate sha256:[0-9a-f]+ is revoked"):
            drv.train(on_step=on_step)
    assert done == [1, 2]  # refused within one step: step 3 never completed
    rows = c.parties["bob"].audit.db.execute(
        "SELECT caller, op, decision FROM audit WHERE op = '(revoked)'").fetchall()
    assert rows and rows[0] == ("alice", "(revoked)", "deny")
    # the step alice sent after her revocation was applied nowhere; the step before it, committed by the driver
    # (not revoked: another identity), everywhere
    assert c.parties["bob"].step == 2 and c.parties["alice"].step == 2
    assert c.client("bob", "operator").call(Message("status")).meta["party"] == "bob"  # the driver still may


def test_party_revoke_cli_writes_the_pin_and_says_so(make_chain):
    from typer.testing import CliRunner

    from modelward.cli.main import app

    c = make_chain(driver="operator")
    cfg_path = c.split.party_configs["bob"]
    r = CliRunner().invoke(app, ["party", "revoke", "alice", str(cfg_path)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    fp = c.parties["bob"].pins["alice"]
    assert f"revoked: alice {fp}" in r.output
    assert fp in revoked_path(load_party_config(cfg_path)).read_text()
    r = CliRunner().invoke(app, ["party", "revoke", "alice", str(cfg_path)], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "already revoked" in r.output
    r = CliRunner().invoke(app, ["party", "revoke", "mallory", str(cfg_path)], env={"COLUMNS": "200"})
    assert r.exit_code != 0 and "not a pinned peer" in str(r.exception) + r.output
