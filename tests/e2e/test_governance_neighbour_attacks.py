"""Issue 26's attacks, run against real party processes under the shipped defaults, each asserting that it now
fails — and that a legitimate run under the same defaults trains as before.

Alice (data key, conv1) and Bob (the rest, the labels) are two `party serve` processes on 127.0.0.1; the driver has
its own control identity, "operator". Bob's policy is the shipped examples/policy_bob.toml, and his PARTY.toml keeps
its defaults (label protection, integrity). Alice's server records the gradients she receives (what an
honest-but-curious Alice keeps). The tests share one set of servers and one legitimate run (the `legit` fixture).
"""

import os
import sqlite3
import time
import tomllib
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from modelward.cli.audit import app as audit_app
from modelward.core.data import DataConfig, load_data
from modelward.core.init import init_model_
from modelward.core.io import load_tensors
from modelward.core.train import TrainConfig, train
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ModelwardError
from modelward.governance.audit import verify
from modelward.governance.demo import prepare_local_split
from modelward.governance.driver import OutputsKept, SplitDriver
from modelward.governance.extraction_audit import PartyOracle
from modelward.governance.leakage.parties import read_recording, start_recording_party
from modelward.governance.neighbour_audit import (
    Victim,
    eval_oracle_curve,
    gradient_label_recovery,
    labels_from_answers,
    query_pool,
    surrogate_curve,
)
from modelward.governance.party.config import TLSConfig
from modelward.governance.plan import segment_of
from modelward.governance.protocol import ConsentDenied, PartyError
from modelward.governance.transport.client import GrpcPartyClient
from modelward.governance.trust.certs import ca_sign, keygen
from modelward.governance.wire import Message, WireError

EX = Path(__file__).resolve().parents[2] / "examples"
MODEL = ModelConfig(arch="cnn", channels=[16, 32], fc=64)  # the demo's
TC = TrainConfig(optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=1e-4, batch_size=64, steps=46, eval_every=46,
                 loss="error")  # two epochs of the 1437 training images
runner = CliRunner()


@pytest.fixture(scope="module")
def parties(tmp_path_factory):
    root = tmp_path_factory.mktemp("neighbour")
    data = load_data(DataConfig(source="digits", seed=0))
    bob_policy = tomllib.loads((EX / "policy_bob.toml").read_text())  # the shipped defaults
    # the model gives the plan and the architecture only: each party draws its own initial parameters (Glorot,
    # own_init=False). The two secrets of the defaults -- each party's init seed and Bob's Marvell noise key, both
    # from the OS CSPRNG -- are given as test seeds here, so that the legitimate run is one number on a machine:
    # unseeded, its accuracy is a draw with a long lower tail (see the threshold below), which once ended a CI run
    # at 0.78. Seeded runs under two CPU hogs left the same state digests as quiet ones (no timing path)
    model = init_model_(build_model(MODEL, (1, 8, 8), 10), "glorot_uniform", 0)
    extra = {"alice": {"anchor_every_s": 1.0, "init": {"test_seed": 1000}},
             "bob": {"anchor_every_s": 1.0, "init": {"test_seed": 2000},
                     "label_protection": {"method": "marvell", "scale": 4.0, "seed": 0}}}  # the default method
    split = prepare_local_split(root, model, data, ["alice", "bob"], ["conv1"],
                                own_init=False, threads=1, exact=False, driver="operator",
                                policies={"bob": bob_policy, "alice": {"allow_peers": ["operator"],
                                                                       "training": True, "inference": True}},
                                extra=extra)
    carol = keygen("carol", root / "carol")  # a certificate the parties' CA signs, and nobody pins
    ca_sign(root / "certs", carol["csr"], out=root / "carol" / "carol.pem", force=True)
    split.start(["bob"])
    record = root / "alice" / "received.safetensors"
    split.processes["alice"] = start_recording_party(split.party_configs["alice"], root / "alice" / "server.log",
                                                     record)
    yield split, data, root, record
    split.stop()


def _tls(root, who):
    return TLSConfig(ca=str(root / "certs/ca.pem"), cert=str(root / f"certs/{who}.pem"),
                     key=str(root / f"certs/{who}.key"))


def _oracle(split, root):
    pin = split.split_config(TC, 0).parties[1].pin()
    return PartyOracle(split.processes["bob"].address, _tls(root, "alice"), _tls(root, "operator"), pin)


@pytest.fixture(scope="module")
def legit(parties):
    """The legitimate run under the defaults, once: its result, the exported parts and what later tests need (the
    other tests take it from here, so a failed accuracy check does not turn into their KeyErrors)."""
    split, data, root, _ = parties
    with SplitDriver(split.split_config(TC, seed=0, retry_s=0.0, timeout_s=120.0)) as drv:
        res = drv.train()
        exports = drv.checkpoint_all(export=True)
        with pytest.raises(OutputsKept, match="bob keeps its outputs"):  # the driver gets no outputs either
            drv.predict("test")
    state = {k: v for m in exports.values() for k, v in load_tensors(m["export"]).items()}
    full = build_model(MODEL, (1, 8, 8), 10)
    full.load_state_dict(state)
    full.eval()
    alice, bob = segment_of(full, ["conv1"]), segment_of(full, ["conv2", "fc1", "logits"])
    with torch.no_grad():
        out = {"h_train": alice(data.x_train), "h_test": alice(data.x_test)}
    out["victim"] = Victim("bob", bob, lambda: segment_of(build_model(MODEL, (1, 8, 8), 10),
                                                            ["conv2", "fc1", "logits"]), 10)
    out["accuracy"] = 1.0 - res.curve[-1][1]
    # what the run left, read now (a later test poisons bob on purpose, and a shuffled order may run it first): every
    # training step refused or rolled back, and every halt (integrity)
    out["outliers"] = {}
    for p in ("alice", "bob"):
        db = sqlite3.connect(root / p / "audit.db")
        out["outliers"][p] = db.execute("SELECT COUNT(*) FROM audit WHERE (op = 'step' AND decision IN ('error', "
                                        "'deny')) OR op = 'halt'").fetchone()[0]
        db.close()
    out["kept_rows"] = sum(len(f.read_text().splitlines()) - 1
                           for f in sorted((root / "bob/checkpoints/predictions").glob("*.csv")))
    return out


def test_a_legitimate_run_under_the_defaults_trains_as_before(parties, legit):
    split, data, root, _ = parties
    acc = legit["accuracy"]
    # the same steps, monolithic, no protection, from three random initialisations (0.886-0.922 here)
    mono = []
    for seed in range(3):
        model = init_model_(build_model(MODEL, (1, 8, 8), 10), "glorot_uniform", seed)
        mono.append(1.0 - train(model, data.x_train, data.y_train, data.x_test, data.y_test, TC, seed=0).curve[-1][1])
    # Marvell at scale 4 costs accuracy in these 46 steps, and how much is a draw. Measured with an in-process
    # mirror of this run (equal to the real parties on 3 draws), over the parties' secret init seeds and noise
    # key: 0.901 +- 0.040, min 0.764 over 80 draws (12 of them below the old bound min(mono) - 0.03 = 0.856, the
    # CI run's 0.78 among them); without the noise 0.923 +- 0.032 (30 draws). The seeded draw above gives 0.914
    # here and 0.922-0.933 with other kernels (ATEN_CPU_CAPABILITY=default or avx2, oneDNN off or AVX2): a seeded
    # draw moved by up to 0.06 across kernel paths. The bound is the protection's measured cost, below every draw
    # of the defaults measured, not a tolerance fitted to this draw
    assert acc >= min(mono) - 0.15, (acc, mono)
    assert legit["outliers"] == {"alice": 0, "bob": 0}  # nothing refused or halted in a normal run
    assert legit["kept_rows"] == len(data.y_test)  # bob kept the predictions of every test row


def test_the_64_row_predict_surrogate_gets_nothing(parties, legit):
    split, _, root, _ = parties
    oracle = _oracle(split, root)
    try:
        pts = surrogate_curve(oracle, legit["victim"], query_pool("natural", legit["h_train"], 64), legit["h_test"],
                              [64])
        # alice's data key may not fetch either (a control operation): the role check refuses it
        with pytest.raises(ConsentDenied, match="may not call fetch"):
            oracle.data.call(Message("fetch", oracle.session, meta={"token": "x" * 32}))
    finally:
        oracle.close()
    assert len(pts) == 1 and pts[0].refused and pts[0].rows == 0 and pts[0].agreement == pts[0].chance
    assert "keeps his outputs" in pts[0].note


def test_the_duplicate_index_eval_oracle_is_refused(parties, legit):
    split, data, root, _ = parties
    known = {c: int((data.y_test == c).nonzero()[0]) for c in range(10)}
    oracle = _oracle(split, root)
    try:
        pts = eval_oracle_curve(oracle, legit["victim"], query_pool("natural", legit["h_train"], 4), legit["h_test"],
                                known, [80])
        with pytest.raises(ConsentDenied, match="1 distinct indices"):
            oracle.eval_sum(legit["h_train"][:8], torch.full((8,), known[3]), "test", "cross_entropy")
        with pytest.raises(ConsentDenied, match="eval_splits"):  # and never on the training labels
            oracle.eval_sum(legit["h_train"][:8], torch.arange(8), "train", "error")
    finally:
        oracle.close()
    assert pts[0].refused and pts[0].rows == 0 and "distinct" in pts[0].note


def test_predict_on_the_training_split_is_refused(parties, legit):
    split, data, root, _ = parties
    oracle = _oracle(split, root)
    try:
        point = labels_from_answers(oracle, legit["h_train"], data.y_train, 64, "bob")
    finally:
        oracle.close()
    assert point.refused and point.rows == 0 and "predict.splits" in point.note


def test_gradient_clustering_with_the_defaults_recovers_chance(parties, legit):
    split, data, root, record = parties
    deadline = time.monotonic() + 30  # the recorder flushes every 10 steps and on stop; wait for the first epoch
    while time.monotonic() < deadline and not (record.is_file() and len(read_recording(record)) >= 22):
        time.sleep(0.5)
    received = read_recording(record)[:22]  # the first epoch (the issue: 86 % recovered without protection)
    g = torch.cat([r[2] for r in received])
    y = torch.cat([data.y_train[r[1]] for r in received])
    got, chance = gradient_label_recovery(g, y, 10)
    # near chance (the same score with permuted labels): the issue measured 86 % without protection; under the
    # default Marvell (scale 4) audit-extraction measured 0.21 against a chance level of 0.13 on 200 steps
    assert got < chance + 0.15 and got < 0.35, (got, chance)


def test_in_bounds_poisoning_is_halted_and_changes_nothing(parties, legit):
    """h = 300·N(0,1), far inside max_abs_input: bob's trend detector halts the training at once, before anything
    is computed (the slow poisoning of issue 36 is tests/e2e/test_governance_poisoning.py)."""
    split, _, root, _ = parties
    alice = GrpcPartyClient("bob", split.processes["bob"].address, _tls(root, "alice"), timeout=30)
    st = alice.call(Message("open", "poison")).meta
    digest = alice.call(Message("status", "poison", meta={"digest": True})).meta["digest"]
    h = 300 * torch.randn(64, 16, 4, 4)
    assert h.abs().max() < 1e6  # far inside max_abs_input
    with pytest.raises(PartyError, match="suspected poisoning"):
        alice.call(Message("step", "poison", st["step"], st["last_seq"] + 1, {},
                           {"h": h.contiguous(memory_format=torch.channels_last), "idx": torch.arange(64)}))
    assert alice.call(Message("status", "poison", meta={"digest": True})).meta["digest"] == digest
    alice.close()


def test_the_60_mib_message_is_dropped_before_it_is_buffered(parties, legit):
    split, _, root, _ = parties
    pid = split.processes["bob"].proc.pid

    def peak_rss_mib() -> float:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return 0.0

    before = peak_rss_mib()
    tls = TLSConfig(ca=str(root / "certs/ca.pem"), cert=str(root / "carol/carol.pem"),
                    key=str(root / "carol/carol.key"))
    carol = GrpcPartyClient("bob", split.processes["bob"].address, tls, max_message_mb=128,
                            check=False, timeout=30)
    big = Message("status", tensors={"x": torch.zeros(15 * 2**20)})  # 60 MiB
    t0 = time.monotonic()
    for _ in range(3):
        with pytest.raises((WireError, ModelwardError)):
            carol.call(big)
    took = time.monotonic() - t0
    carol.close()
    # a message buffered whole would raise bob's peak by at least its 60 MiB (one of the three at a time); what
    # arrives before the size check (HTTP/2 flow-control windows) and bob's own background work (an asynchronous
    # checkpoint, the anchor exchange) stays below that: 43 MiB seen once under a loaded two-worker run
    assert took < 20 and peak_rss_mib() - before < 60, (took, before, peak_rss_mib())


def test_records_after_the_last_step_cannot_be_deleted_unseen(parties, legit, tmp_path):
    split, _, root, _ = parties
    oracle = _oracle(split, root)  # a refusal of this test's own after training (the module runs in any order)
    try:
        with pytest.raises(ConsentDenied, match="may not call fetch"):
            oracle.data.call(Message("fetch", oracle.session, meta={"token": "x" * 32}))
    finally:
        oracle.close()
    time.sleep(2.5)  # anchor_every_s = 1: the refusals are anchored in alice's log by now
    for p in ("alice", "bob"):
        src, dst = sqlite3.connect(root / p / "audit.db"), sqlite3.connect(tmp_path / f"{p}.db")
        src.backup(dst)
        src.close()
        dst.close()
    r = runner.invoke(audit_app, ["verify", str(tmp_path / "bob.db"), "--against", str(tmp_path / "alice.db")])
    assert r.exit_code == 0 and "OK" in r.output, r.output
    db = sqlite3.connect(tmp_path / "bob.db")  # bob deletes his records of the refused attacks (after training)
    first = db.execute("SELECT MIN(id) FROM audit WHERE session IN ('poison') OR op = 'fetch'").fetchone()[0]
    assert first is not None
    db.execute("DELETE FROM audit WHERE id >= ?", (first,))
    db.commit()
    db.close()
    assert verify(tmp_path / "bob.db").ok  # the chain alone cannot tell
    r = runner.invoke(audit_app, ["verify", str(tmp_path / "bob.db"), "--against", str(tmp_path / "alice.db")])
    assert r.exit_code == 1 and "truncated" in r.output, r.output


def test_one_key_in_both_roles_is_named_at_start(parties, tmp_path):
    """The shipped examples separate the roles; a configuration that gives alice both says so when it starts."""
    split, data, _, _ = parties
    same = prepare_local_split(tmp_path / "same", build_model(MODEL, (1, 8, 8), 10), data, ["alice", "bob"],
                               ["conv1"], own_init=False, threads=1)
    same.start(["bob"])
    try:
        log = (tmp_path / "same/bob/server.log").read_text()
    finally:
        same.stop()
    assert "WARNING party bob: 'alice' holds both the data role" in log
    assert "WARNING" not in (split.root / "bob/server.log").read_text()
    assert os.path.getsize(split.root / "bob/server.log") > 0
