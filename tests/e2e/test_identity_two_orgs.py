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
from modelward.governance.client import GrpcPartyClient
from modelward.governance.config import TLSConfig
from modelward.governance.demo import prepare_local_split
from modelward.governance.identity import cert_fingerprint
from modelward.governance.launch import start_party
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
