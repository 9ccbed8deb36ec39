"""Issue 10's attacks, run against real party processes (alice -> carol -> bob, mutual TLS on 127.0.0.1), each
asserting that it now fails. One set of servers is shared by the module; the tests run in order."""

import sqlite3
import threading

import pytest
import torch
from typer.testing import CliRunner

from modelward.cli.audit import app as audit_app
from modelward.core.data import DataConfig, load_data
from modelward.core.init import init_model_
from modelward.core.io import load_tensors
from modelward.core.train import TrainConfig, train
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import IdentityError
from modelward.governance.audit import verify
from modelward.governance.demo import prepare_local_split
from modelward.governance.driver import SplitDriver
from modelward.governance.party.config import TLSConfig
from modelward.governance.protocol import ConsentDenied, NumericError
from modelward.governance.transport.client import GrpcPartyClient
from modelward.governance.transport.launch import start_party
from modelward.governance.trust.certs import make_certs
from modelward.governance.wire import Message

MODEL = ModelConfig(arch="cnn", channels=[4, 8], fc=16)
TC = TrainConfig(steps=9, eval_every=3, batch_size=32, lr=0.05)
STATE: dict = {}
runner = CliRunner()


def _tls(folder, who, ca):
    return TLSConfig(ca=str(ca), cert=str(folder / f"{who}.pem"), key=str(folder / f"{who}.key"))


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    root = tmp_path_factory.mktemp("attacks")
    data = load_data(DataConfig(source="digits", seed=0))
    model = build_model(MODEL, (1, 8, 8), 10)  # structure only: every party draws its own parameters
    bundle = root / "bundle.pem"  # the documented two-organisation CA bundle
    tls = {p: {"ca": str(bundle), "cert": str(root / f"certs/{p}.pem"), "key": str(root / f"certs/{p}.key")}
           for p in ("alice", "carol", "bob")}
    bob_policy = {"allow_peers": ["alice", "carol"], "training": True, "inference": True, "min_batch": 8,
                  "max_steps_total": 40}
    split = prepare_local_split(root, model, data, ["alice", "carol", "bob"], ["conv1", "conv2"], own_init=False,
                                checkpoint_every=3, threads=1, policies={"bob": bob_policy},
                                extra={p: {"tls": t} for p, t in tls.items()})
    make_certs(root / "other", ["alice"], ca_name="other-org-ca")  # another organisation's CA names a cert "alice"
    bundle.write_bytes((root / "certs/ca.pem").read_bytes() + (root / "other/ca.pem").read_bytes())
    split.tls = TLSConfig(**tls["alice"])
    split.start()
    yield split, data, root
    split.stop()


def _driver(split, **kw):
    return SplitDriver(split.split_config(TC, seed=5, retry_s=60.0, timeout_s=20.0), **kw)


def test_private_parts_are_not_reproducible_from_any_seed(chain):
    split, _, root = chain
    with _driver(split) as drv:
        drv.open(train=True)
        exports = drv.checkpoint_all(export=True)
    # the harness reads every party's export (it stands in for all three organisations)
    STATE["init"] = {k: v for m in exports.values() for k, v in load_tensors(m["export"]).items()}
    for seed in range(8):  # alice knows the architecture and the scheme: she tries the seeds a config would use
        guess = init_model_(build_model(MODEL, (1, 8, 8), 10), "glorot_uniform", seed).state_dict()
        for k in ("conv2.0.conv.weight", "fc1.weight", "logits.weight"):  # carol's and bob's parameters
            assert not torch.equal(guess[k], STATE["init"][k]), (seed, k)


def test_training_survives_kill9_matches_monolithic_and_the_driver_sees_no_tensor(chain):
    split, data, _ = chain
    restarted = {}

    def on_step(step, loss, links):
        if step == 5 and not restarted:  # carol has checkpoints at 0 and 3; the others are at step 5
            carol = split.processes["carol"]
            carol.kill()
            restarted["t"] = threading.Thread(target=lambda: restarted.setdefault("p", start_party(
                split.party_configs["carol"], carol.log, [f"port={carol.port}"])))
            restarted["t"].start()

    with _driver(split) as drv:
        res = drv.train(on_step=on_step)
        exports = drv.checkpoint_all(export=True)
        received = [(p, op, names) for p, op, names in drv.received if names]
        with pytest.raises(ConsentDenied, match="min_batch"):  # no per-sample loss oracle for the driver either
            drv.call("alice", "eval", 0, {"split": "test"}, {"idx": torch.arange(1)})
    restarted["t"].join()
    split.processes["carol"] = restarted["p"]
    assert res.resumes >= 1 and res.steps_run == TC.steps
    assert received == []  # labels, activations, gradients and the middle party's tensors never reach the driver
    ref = build_model(MODEL, (1, 8, 8), 10)
    ref.load_state_dict(STATE["init"])
    mono = train(ref, data.x_train, data.y_train, data.x_test, data.y_test, TC, seed=5)
    state = {k: v for m in exports.values() for k, v in load_tensors(m["export"]).items()}
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(state[k], v, atol=1e-5, rtol=1e-5, msg=k)
    assert [s for s, _ in res.curve] == [s for s, _ in mono.curve]
    assert all(abs(a - b) < 1e-9 for (_, a), (_, b) in zip(res.curve, mono.curve, strict=True))


def test_a_pipelined_driver_survives_kill9_of_the_first_party(chain):
    """Over the network the driver sends step s+1 before step s is answered. Alice, who receives both, is killed
    with a step in flight behind the one she is running: the run resumes from the common checkpoint and ends
    exactly where monolithic training of the same steps does."""
    split, data, _ = chain
    tc = TrainConfig(steps=15, eval_every=3, batch_size=32, lr=0.05)
    restarted = {}

    def on_step(step, loss, links):
        if step == 11 and not restarted:  # alice's checkpoints: 9 (and before); step 12 is on its way to her
            alice = split.processes["alice"]
            alice.kill()
            restarted["t"] = threading.Thread(target=lambda: restarted.setdefault("p", start_party(
                split.party_configs["alice"], alice.log, [f"port={alice.port}"])))
            restarted["t"].start()

    with SplitDriver(split.split_config(tc, seed=5, retry_s=60.0, timeout_s=20.0)) as drv:
        assert drv._pipelined()
        res = drv.train(on_step=on_step)
        exports = drv.checkpoint_all(export=True)
    restarted["t"].join()
    split.processes["alice"] = restarted["p"]
    assert res.resumes >= 1 and res.steps_run == tc.steps
    ref = build_model(MODEL, (1, 8, 8), 10)
    ref.load_state_dict(STATE["init"])
    train(ref, data.x_train, data.y_train, data.x_test, data.y_test, tc, seed=5)
    state = {k: v for m in exports.values() for k, v in load_tensors(m["export"]).items()}
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(state[k], v, atol=1e-5, rtol=1e-5, msg=k)


def test_impersonation_by_another_ca_is_refused_and_audited(chain):
    split, _, root = chain
    fake = _tls(root / "other", "alice", root / "bundle.pem")  # a valid certificate named alice, wrong key
    for party in ("bob", "carol"):
        c = GrpcPartyClient(party, split.processes[party].address, fake, check=False, timeout=10)
        for _ in range(3):
            with pytest.raises(IdentityError, match="not pinned"):
                c.call(Message("status"))
        c.close()
    db = sqlite3.connect(root / "bob/audit.db")
    rows = db.execute("SELECT caller, decision FROM audit WHERE op='(identity)'").fetchall()
    assert len(rows) == 1 and rows[0][0].startswith("unpinned sha256:") and rows[0][1] == "deny"  # rate-limited
    # and the other way round: a driver that pins bob does not talk to carol's server posing at bob's address
    bob_pin = split.split_config(TC, 0).parties[2].pin()
    c = GrpcPartyClient("bob", split.processes["carol"].address, split.tls, bob_pin, timeout=10)
    with pytest.raises(IdentityError, match="not the pinned party bob"):
        c.call(Message("status"))
    c.close()


def test_extreme_activation_is_refused_and_nothing_changes(chain):
    split, _, root = chain
    carol = GrpcPartyClient("bob", split.processes["bob"].address, _tls(root / "certs", "carol", root / "bundle.pem"),
                            timeout=10)  # carol, bob's neighbour, turns malicious
    st = carol.call(Message("open", "evil")).meta
    digest = carol.call(Message("status", "evil", meta={"digest": True})).meta["digest"]
    h = torch.full((16, 8, 2, 2), 3e38)
    h[::2] = -3e38
    with pytest.raises(NumericError, match="max_abs_input"):
        carol.call(Message("step", "evil", st["step"], st["last_seq"] + 1, {}, {"h": h, "idx": torch.arange(16)}))
    assert carol.call(Message("status", "evil", meta={"digest": True})).meta["digest"] == digest
    carol.close()


def _copy(db, dst):
    src = sqlite3.connect(db)
    out = sqlite3.connect(dst)
    src.backup(out)
    src.close()
    out.close()


def test_a_truncated_tail_is_caught_against_another_partys_log(chain, tmp_path):
    _, _, root = chain
    for p in ("alice", "bob"):
        _copy(root / p / "audit.db", tmp_path / f"{p}.db")
    r = runner.invoke(audit_app, ["verify", str(tmp_path / "bob.db"), "--against", str(tmp_path / "alice.db")])
    assert r.exit_code == 0 and "OK" in r.output, r.output
    db = sqlite3.connect(tmp_path / "bob.db")  # bob cuts his last records: the chain itself still verifies
    n = db.execute("SELECT MAX(id) FROM audit").fetchone()[0]
    db.execute("DELETE FROM audit WHERE id > ?", (n - 12,))
    db.commit()
    db.close()
    assert verify(tmp_path / "bob.db").ok
    r = runner.invoke(audit_app, ["verify", str(tmp_path / "bob.db"), "--against", str(tmp_path / "alice.db")])
    assert r.exit_code == 1 and "truncated" in r.output, r.output
    r = runner.invoke(audit_app, ["head", str(tmp_path / "alice.db")])
    assert r.exit_code == 0 and r.output.startswith("alice "), r.output


def test_limits_survive_new_sessions_and_restarts_and_the_purpose_trick_fails(chain):
    """(A party with training = false refusing a disguised step is tested in-process: tests/governance.)"""
    split, _, root = chain
    with _driver(split, session="greedy") as drv:
        drv.open(train=True)
        step = drv.status["alice"]["step"]
        with pytest.raises(ConsentDenied, match="max_steps_total"):
            for _ in range(60):
                drv.train_step(step, torch.arange(32))
                step += 1
    bob = split.processes["bob"]
    bob.kill()  # a crash, then the same configuration again
    split.processes["bob"] = start_party(split.party_configs["bob"], bob.log, [f"port={bob.port}"])
    with _driver(split, session="brand-new") as drv:
        drv.open(train=True)
        with pytest.raises(ConsentDenied, match="40 training steps in total"):
            drv.train_step(drv.status["alice"]["step"], torch.arange(32))
    # the old purpose trick: a training step sent "for inference" is still a training step, still counted
    carol = GrpcPartyClient("bob", split.processes["bob"].address,
                            _tls(root / "certs", "carol", root / "bundle.pem"), timeout=10)
    st = carol.call(Message("open", "trick")).meta
    for purpose in ("predict", "inference", "eval"):
        with pytest.raises(ConsentDenied, match="max_steps_total"):
            carol.call(Message("step", "trick", st["step"], st["last_seq"] + 1, {"purpose": purpose},
                               {"h": torch.zeros(32, 8, 2, 2), "idx": torch.arange(32)}))
    carol.close()
    db = sqlite3.connect(root / "bob/audit.db")
    assert db.execute("SELECT COUNT(*) FROM audit WHERE session='trick' AND op='step' AND purpose='train' "
                      "AND decision='deny'").fetchone()[0] == 3


def test_requests_sent_out_of_order_cannot_hold_the_first_party_or_get_through(chain):
    """The driver's identity sends data operations that skip numbers (as if steps were in flight before them).
    Alice holds at most two of them, for at most 2 s each, refuses every one as out of order (recorded), and
    answers other requests meanwhile."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from modelward.governance.wire import WireError

    split, _, root = chain
    alice = split.processes["alice"]
    drv = GrpcPartyClient("alice", alice.address, split.tls, timeout=20)
    st = drv.call(Message("open", "gaps")).meta
    seq = st["last_seq"] + 1
    drv.call(Message("eval", "gaps", 0, seq, {"split": "test"}, {"idx": torch.arange(32)}))  # one answered
    gap = [Message("eval", "gaps", 0, seq + k, {"split": "test"}, {"idx": torch.arange(32)}) for k in (5, 6, 9)]

    def refused(msg):
        t0 = time.monotonic()
        with pytest.raises(WireError, match="out-of-order"):
            drv.call(msg)
        return time.monotonic() - t0

    with ThreadPoolExecutor(3) as pool:
        pending = [pool.submit(refused, m) for m in gap[:2]]
        time.sleep(0.3)  # both wait now; the third arrives once two are waiting
        pending.append(pool.submit(refused, gap[2]))
        t0 = time.monotonic()
        assert drv.call(Message("status", "gaps")).meta["party"] == "alice"  # not blocked meanwhile
        status_s = time.monotonic() - t0
        waits = [f.result() for f in pending]
    assert 1.5 < waits[0] < 4.0 and 1.2 < waits[1] < 4.0 and waits[2] < 1.0  # two wait (up to 2 s), not a third
    assert status_s < 1.0  # answered while two of them waited
    # the session goes on with the next number
    drv.call(Message("eval", "gaps", 0, seq + 1, {"split": "test"}, {"idx": torch.arange(32)}))
    drv.close()
    db = sqlite3.connect(root / "alice/audit.db")
    assert db.execute("SELECT COUNT(*) FROM audit WHERE session='gaps' AND decision='deny' AND reason LIKE "
                      "'%out-of-order%'").fetchone()[0] == 3
