"""Pinned identities against a real party process, with keys made the way two organisations make them
(issue 10 items 5 and 10). Each organisation runs its own CA (`party ca init`) and makes its party's key on its
own host (`party keygen`, CSR signed by `party ca sign`). Alice's server trusts a bundle of both CAs. Bob's CA then
issues a certificate named `alice`: the TLS handshake accepts it, but Alice's server refuses it by its pin and
records the refusal with the presented fingerprint."""

import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from modelward.cli.party import app as party_app
from modelward.core.data import DataConfig, load_data
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import IdentityError
from modelward.governance.demo import prepare_local_split
from modelward.governance.party.config import TLSConfig
from modelward.governance.transport.client import GrpcPartyClient
from modelward.governance.transport.launch import start_party
from modelward.governance.trust.identity import cert_fingerprint
from modelward.governance.wire import Message

runner = CliRunner()


def _cli(*args: str) -> str:
    r = runner.invoke(party_app, list(args))
    assert r.exit_code == 0, r.output + str(r.exception)
    return r.output


def _org(root: Path, org: str, party: str, rogue: str | None = None) -> dict[str, Path]:
    """One organisation: its CA, its party's own key + CA-signed certificate, optionally a rogue certificate."""
    _cli("ca", "init", "--out", str(root / "ca"), "--name", org)
    _cli("keygen", party, "--out", str(root / party))
    _cli("ca", "sign", str(root / party / f"{party}.csr"), "--ca", str(root / "ca"))
    out = {"ca": root / "ca/ca.pem", "cert": root / party / f"{party}-signed.pem", "key": root / party / f"{party}.key"}
    if rogue:
        _cli("keygen", rogue, "--out", str(root / "rogue"))
        _cli("ca", "sign", str(root / "rogue" / f"{rogue}.csr"), "--ca", str(root / "ca"))
        out |= {"rogue_cert": root / "rogue" / f"{rogue}-signed.pem", "rogue_key": root / "rogue" / f"{rogue}.key"}
    return out


def test_bobs_ca_cannot_make_an_alice(tmp_path):
    a = _org(tmp_path / "org_a", "Org A", "alice")
    b = _org(tmp_path / "org_b", "Org B", "bob", rogue="alice")
    bundle = tmp_path / "bundle.pem"  # both organisations' CAs: distinct names, one file
    bundle.write_bytes(a["ca"].read_bytes() + b["ca"].read_bytes())
    data = load_data(DataConfig(source="breast_cancer"))
    model = build_model(ModelConfig(arch="mlp", hidden=[8]), data.input_shape, data.num_classes)
    alice_tls = {"ca": str(bundle), "cert": str(a["cert"]), "key": str(a["key"])}
    split = prepare_local_split(
        tmp_path / "run", model, data, ["alice", "bob"], ["fc1"], own_init=False, threads=1,
        extra={"alice": {"tls": alice_tls, "peers": {"bob": {"fingerprint": cert_fingerprint(b["cert"].read_bytes())}}}})
    alice = start_party(split.party_configs["alice"], tmp_path / "run/alice/server.log")
    try:
        own = TLSConfig(**alice_tls)
        pin = cert_fingerprint(a["cert"].read_bytes())
        good = GrpcPartyClient("alice", alice.address, own, pin, timeout=20)
        assert good.call(Message("status")).op == "status"  # Alice's own driver, identified by her pin
        good.close()
        rogue = TLSConfig(ca=str(bundle), cert=str(b["rogue_cert"]), key=str(b["rogue_key"]))
        fake_fp = cert_fingerprint(b["rogue_cert"].read_bytes())
        bad = GrpcPartyClient("alice", alice.address, rogue, pin, timeout=20)
        with pytest.raises(IdentityError, match="not pinned"):
            bad.call(Message("status"))
        bad.close()
    finally:
        alice.stop()
    db = sqlite3.connect(tmp_path / "run/alice/audit.db")
    rows = db.execute("SELECT caller, decision, reason FROM audit WHERE op='(identity)'").fetchall()
    db.close()
    assert len(rows) == 1 and rows[0][1] == "deny"
    assert rows[0][0].startswith("unpinned " + fake_fp[:16]) and fake_fp in rows[0][2] and "'alice'" in rows[0][2]


def test_a_handshake_with_an_unknown_ca_is_refused_and_audited(tmp_path):
    """A client whose certificate no trusted CA signed never reaches the party's code (gRPC refuses the TLS
    handshake); the party server still records the refusal, rate-limited, and its log keeps gRPC's line."""
    import time

    import grpc

    from modelward.governance.trust.certs import make_certs

    data = load_data(DataConfig(source="breast_cancer"))
    model = build_model(ModelConfig(arch="mlp", hidden=[8]), data.input_shape, data.num_classes)
    split = prepare_local_split(tmp_path / "run", model, data, ["alice", "bob"], ["fc1"], own_init=False, threads=1,
                                extra={"alice": {"audit_refusals_every_s": 30.0}})
    make_certs(tmp_path / "stranger", ["mallory"])
    log = tmp_path / "run/alice/server.log"
    alice = start_party(split.party_configs["alice"], log)
    try:
        creds = grpc.ssl_channel_credentials((tmp_path / "run/certs/ca.pem").read_bytes(),
                                             (tmp_path / "stranger/mallory.key").read_bytes(),
                                             (tmp_path / "stranger/mallory.pem").read_bytes())
        for _ in range(3):  # three attempts: one record, the other two counted in the next one
            with grpc.secure_channel(alice.address, creds, options=[("grpc.ssl_target_name_override", "alice")]) as ch:
                with pytest.raises(grpc.RpcError):
                    ch.unary_unary("/modelward.Party/Call")(b"hello", timeout=5)
        rows: list = []
        deadline = time.monotonic() + 20
        while not rows and time.monotonic() < deadline:
            time.sleep(0.2)
            db = sqlite3.connect(tmp_path / "run/alice/audit.db")
            rows = db.execute("SELECT caller, decision, reason FROM audit WHERE op = '(tls handshake)'").fetchall()
            db.close()
        # the party still serves its own driver normally
        own = TLSConfig(ca=str(tmp_path / "run/certs/ca.pem"), cert=str(tmp_path / "run/certs/alice.pem"),
                        key=str(tmp_path / "run/certs/alice.key"))
        good = GrpcPartyClient("alice", alice.address, own, cert_fingerprint(
            (tmp_path / "run/certs/alice.pem").read_bytes()), timeout=20)
        assert good.call(Message("status")).meta["party"] == "alice"
        good.close()
    finally:
        alice.stop()
    assert len(rows) == 1, rows  # rate-limited: one record for the burst
    caller, decision, reason = rows[0]
    assert caller == "(unauthenticated TLS client)" and decision == "deny"
    assert "CERTIFICATE_VERIFY_FAILED" in reason or "certificate" in reason.lower(), reason
    text = log.read_text()
    assert "Handshake failed" in text and "READY alice" in text and "stopped at step" in text
