"""Anchors across restarts (issue 36 item 6), against real party processes.

Alice and Bob are two `party serve` processes with `port = 0` and `anchor_every_s = 1`. Bob is stopped and started
again on another port (his old one is taken meanwhile): he tells Alice where he is in his anchor exchange, Alice
proves it (pin) and anchors his records there, without any driver. A hostile caller cannot redirect Alice: the
driver's key may not announce, and an address Bob's own key gives is used only once a server proves to be Bob at
it. A clean stop anchors the records written since the last exchange.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import time
from pathlib import Path

import pytest

from modelward.core.data import DataConfig, load_data
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig, build_model
from modelward.governance.audit import anchors_in, verify_against
from modelward.governance.demo import prepare_local_split
from modelward.governance.driver import SplitDriver
from modelward.governance.party.config import TLSConfig
from modelward.governance.protocol import ConsentDenied
from modelward.governance.transport.client import GrpcPartyClient
from modelward.governance.wire import Message

pytestmark = pytest.mark.slow
TC = TrainConfig(optimizer="sgd", lr=0.05, batch_size=32, steps=2, eval_every=2, eval_batch_size=512)


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    root = tmp_path_factory.mktemp("anchors")
    data = load_data(DataConfig(source="digits", seed=0))
    model = build_model(ModelConfig(arch="cnn", channels=[4, 8], fc=16), (1, 8, 8), 10)
    s = prepare_local_split(root, model, data, ["alice", "bob"], ["conv1"], own_init=False, threads=1,
                            driver="operator", extra={p: {"anchor_every_s": 1.0} for p in ("alice", "bob")})
    s.start()
    with SplitDriver(s.split_config(TC, seed=0, retry_s=0.0)) as drv:  # alice learns bob's address (a session)
        drv.open(train=False)
    yield s, root
    s.stop()


def _client(root: Path, who: str, to: str, address: str) -> GrpcPartyClient:
    tls = TLSConfig(ca=str(root / "certs/ca.pem"), cert=str(root / f"certs/{who}.pem"),
                    key=str(root / f"certs/{who}.key"))
    return GrpcPartyClient(to, address, tls, timeout=20.0)


def _wait(cond, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def _decision(db: Path) -> int:
    con = sqlite3.connect(db)
    try:
        return int(con.execute("SELECT MAX(id) FROM audit WHERE op != 'anchor'").fetchone()[0])
    finally:
        con.close()


def _anchored(alice_db: Path, party: str) -> int:
    return max((rid for rid, _, _ in anchors_in(alice_db, party)), default=0)


def test_a_party_restarted_on_another_port_is_found_and_anchored_and_nobody_else_can_redirect(split, tmp_path):
    s, root = split
    alice_db, bob_db = root / "alice/audit.db", root / "bob/audit.db"
    alice, old = s.processes["alice"].address, s.processes["bob"].address
    stores = {p: root / p / "checkpoints/neighbours.json" for p in ("alice", "bob")}

    def proven(p: str) -> dict:
        return json.loads(stores[p].read_text()) if stores[p].exists() else {}

    assert _wait(lambda: proven("bob").get("alice") == alice and proven("alice").get("bob") == old)
    # a hostile caller: the driver's key is pinned by alice but is not her neighbour, so it may not announce
    offer = {"offer": {"head": [1, "0" * 64], "decision": 0}, "address": alice}  # "bob is now at alice's address"
    op = _client(root, "operator", "alice", alice)
    try:
        with pytest.raises(ConsentDenied, match="'operator' may not call anchor on alice"):
            op.call(Message("anchor", meta=offer))
    finally:
        op.close()

    s.processes.pop("bob").stop()  # a clean stop: its last records are anchored in alice's log on the way out
    assert _anchored(alice_db, "bob") >= _decision(bob_db)
    # while bob is down, a caller with bob's own key gives a wrong address for him: alice tries it (her known
    # one fails now) and refuses it, since the server there proves to be alice, not bob
    liar = _client(root, "bob", "alice", alice)
    try:
        liar.call(Message("anchor", meta=offer))
    finally:
        liar.close()

    def refused() -> bool:
        con = sqlite3.connect(alice_db)
        try:
            return bool(con.execute("SELECT COUNT(*) FROM audit WHERE op = '(address)' AND decision = 'deny' AND "
                                    "reason LIKE '%the server there is not bob%'").fetchone()[0])
        finally:
            con.close()

    assert _wait(refused, timeout=10.0)
    assert proven("alice")["bob"] == old  # not redirected
    # bob's old port is taken while he is down: he comes back on another one. SO_REUSEADDR: the port may still have
    # connections in TIME_WAIT from bob's last exchanges (bind would fail on them); if another process already
    # holds the port, it is taken anyway and no blocker is needed
    blocker = socket.socket()
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        blocker.bind(("127.0.0.1", int(old.rsplit(":", 1)[1])))
        blocker.listen(1)
    except OSError:
        blocker.close()
    try:
        s.start(["bob"])
    finally:
        blocker.close()
    new = s.processes["bob"].address
    assert new != old
    # nobody tells alice (no driver, no session): bob's own exchange does, and alice proves it before using it
    assert _wait(lambda: proven("alice").get("bob") == new)
    op = _client(root, "operator", "bob", new)
    try:
        op.call(Message("status"))  # a control operation: a decision record at bob that no data answer anchors
    finally:
        op.close()
    target = _decision(bob_db)
    assert _wait(lambda: _anchored(alice_db, "bob") >= target, timeout=15.0)  # anchor_every_s = 1, or sooner
    for p in ("alice", "bob"):
        src, dst = sqlite3.connect(root / p / "audit.db"), sqlite3.connect(tmp_path / f"{p}.db")
        src.backup(dst)
        src.close()
        dst.close()
    assert verify_against(tmp_path / "bob.db", tmp_path / "alice.db").ok
    db = sqlite3.connect(tmp_path / "bob.db")  # bob deletes his newest records (the status after the restart)
    db.execute("DELETE FROM audit WHERE id >= ?", (target,))
    db.commit()
    db.close()
    r = verify_against(tmp_path / "bob.db", tmp_path / "alice.db")
    assert not r.ok and "truncated" in r.problem
