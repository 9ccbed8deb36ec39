"""Key rotation mid-training across real servers (issue #27): two party processes and the driver over gRPC + mutual
TLS with a consortium CA. At step 3 of 8 a party's organisation runs `modelward party rotate PARTY.toml --ca CA`
(in the second case also the driver's own key, at step 5)
while the driver keeps training (steps are pipelined, so the next one is already in flight): the party's server
takes the new certificate at its next handshake, its link to the next party reconnects with it, the peer and the
driver follow the rotation statement (signed by the old key) without any re-pin. The run finishes with tensors
bit-identical to an uninterrupted run (and equal to monolithic training), every step applied exactly once on both
parties; afterwards the old key is refused (retired onto the deny-list, audited), a statement signed by another key
is refused, and the old statement replayed is refused."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import torch
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from typer.testing import CliRunner

from modelward.cli.main import app
from modelward.core.data import DataConfig, load_data
from modelward.core.init import init_model_
from modelward.core.io import load_tensors
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import IdentityError
from modelward.governance.audit import AuditLog
from modelward.governance.demo import prepare_local_split
from modelward.governance.driver import SplitDriver
from modelward.governance.party.config import TLSConfig, load_party_config
from modelward.governance.transport.client import GrpcPartyClient
from modelward.governance.trust.certs import _key_pem, _load_ca, _party_cert, _pem
from modelward.governance.trust.identity import cert_fingerprint
from modelward.governance.trust.rotation import ROTATION_OID, fingerprints, rotate_keys, sign_statement
from modelward.governance.wire import Message

STEPS, EVAL_EVERY, ROTATE_AT = 8, 4, 3


def _run(root: Path, rotate: str | None, operator_at: int | None = None) -> dict[str, list[int]]:
    """Train STEPS steps of the demo CNN split alice | bob (driver "operator"), rotating `rotate`'s key after step
    ROTATE_AT (and the driver's own key after step `operator_at`); returns the steps each party's audit log shows
    as applied. The servers are left running in ``_run.split`` for the attacks."""
    data = load_data(DataConfig(source="digits", seed=0))
    model = init_model_(build_model(ModelConfig(arch="cnn", channels=[16, 32], fc=64), (1, 8, 8), 10),
                        "glorot_uniform", 0)
    extra = {p: {"checkpoint_dir": str(root / p / "ckpt"), "rotation_overlap_s": 0.5} for p in ("alice", "bob")}
    split = prepare_local_split(root, model, data, ["alice", "bob"], ["conv1"], threads=1, driver="operator",
                                extra=extra)
    split.start()
    _run.split = split
    tc = TrainConfig(optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=1e-4, batch_size=64, steps=STEPS,
                     eval_every=EVAL_EVERY, loss="error")
    done: list[int] = []

    def on_step(step, loss, links):
        done.append(step)
        if step == ROTATE_AT and rotate is not None:
            shutil.copytree(root / "certs", root / "old-certs")  # the old key, for the attack below
            r = CliRunner().invoke(app, ["party", "rotate", str(split.party_configs[rotate]), "--ca",
                                         str(root / "certs")], env={"COLUMNS": "200"})
            assert r.exit_code == 0, r.output
            assert f"rotation #1 of {rotate}" in r.output
            # (processes look at their key files at most every 50 ms: make sure the remaining steps see the switch
            # on any host speed; the step sent ahead is in flight meanwhile)
            time.sleep(0.1)
        if step == operator_at:  # the driver's identity: no PARTY.toml, the library call
            rotate_keys("operator", root / "certs/operator.key", root / "certs/operator.pem", ca_dir=root / "certs")
            time.sleep(0.1)

    with SplitDriver(split.split_config(tc, 0, retry_s=20.0)) as drv:
        res = drv.train(out_dir=root / "driver", on_step=on_step)
        drv.checkpoint_all()
    assert done == list(range(1, STEPS + 1)) and res.steps_run == STEPS
    assert res.resumes == 0  # nothing failed on the way: the swap interrupted no call
    applied = {}
    for p, caller in (("alice", "operator"), ("bob", "alice")):
        log = AuditLog(load_party_config(split.party_configs[p]).audit_db, p)
        try:
            applied[p] = [s for (s,) in log.db.execute(
                "SELECT step FROM audit WHERE op = 'step' AND decision = 'allow' AND caller = ? ORDER BY id",
                (caller,)).fetchall()]
        finally:
            log.close()
    return applied


def _final(root: Path) -> dict[str, torch.Tensor]:
    out = {}
    for p in ("alice", "bob"):
        ck = sorted((root / p / "ckpt").glob("step_*.safetensors"))[-1]
        out.update({k: v for k, v in load_tensors(ck).items() if k.startswith("model.")})
    return out


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, torch.Tensor]:
    root = tmp_path_factory.mktemp("plain")
    try:
        _run(root, None)
    finally:
        _run.split.stop()
    return _final(root)


def _rows(cfg_path: Path, op: str) -> list[tuple[str, str, str]]:
    log = AuditLog(load_party_config(cfg_path).audit_db, load_party_config(cfg_path).name)
    try:
        return log.db.execute("SELECT caller, decision, reason FROM audit WHERE op = ? ORDER BY id", (op,)).fetchall()
    finally:
        log.close()


def _refused(address: str, pin: str, ca: Path, stem: Path, match: str) -> None:
    """A client with certificate ``stem.pem`` and key ``stem.key`` asks bob for his status: refused (`match`)."""
    client = GrpcPartyClient("bob", address, TLSConfig(ca=str(ca), cert=f"{stem}.pem", key=f"{stem}.key"), pin)
    try:
        with pytest.raises(IdentityError, match=match):
            client.call(Message("status"))
    finally:
        client.close()


def _bit_identical(root: Path, uninterrupted: dict[str, torch.Tensor]) -> None:
    got = _final(root)
    assert sorted(got) == sorted(uninterrupted)
    for k, v in uninterrupted.items():
        assert torch.equal(got[k], v), k


@pytest.mark.slow
def test_alice_rotates_mid_run_and_the_run_is_bit_identical(tmp_path: Path, uninterrupted,
                                                            assert_split_equals_monolithic) -> None:
    try:
        applied = _run(tmp_path, "alice")
        split = _run.split
        new_pem = (tmp_path / "certs/alice.pem").read_bytes()
        old_pem = (tmp_path / "old-certs/alice.pem").read_bytes()
        old_pin, new_pin = cert_fingerprint(old_pem), cert_fingerprint(new_pem)
        assert old_pin != new_pin
        # no step lost or repeated: each applied exactly once, in order, on both parties
        assert applied == {"alice": list(range(STEPS)), "bob": list(range(STEPS))}  # (steps 0..STEPS-1 applied)
        bob_cfg = split.party_configs["bob"]
        # bob followed the statement in-band (audited), the driver followed alice's server certificate
        rot = _rows(bob_cfg, "(rotation)")
        assert any(c == "alice" and "rotation #1 accepted" in r and new_pin in r for c, d, r in rot), rot
        assert (tmp_path / "driver/rotations/alice.json").read_text().count(new_pin) == 1

        # attack 1: a client presenting alice's OLD certificate and key, after its retirement (the overlap of
        # 0.5 s for requests in flight has passed), is refused
        time.sleep(0.6)
        bob_addr = split.processes["bob"].address
        bob_pin = cert_fingerprint((tmp_path / "certs/bob.pem").read_bytes())
        _refused(bob_addr, bob_pin, tmp_path / "certs/ca.pem", tmp_path / "old-certs/alice",
                 "revoked .*retired by rotation #1")
        rot = _rows(bob_cfg, "(rotation)")
        assert any("retired" in r and old_pin in r for c, d, r in rot), rot
        assert old_pin in (tmp_path / "bob/ckpt/revoked.txt").read_text()
        assert any("retired by rotation" in r for c, d, r in _rows(bob_cfg, "(identity)"))

        # attack 2: a CA-signed certificate carrying a statement for alice signed by another key (the CA signs any
        # consortium member's CSR; only alice's key may sign her rotation)
        ca_key, ca_cert = _load_ca(tmp_path / "certs")
        mallory_old, mallory_new = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
        forged = sign_statement("alice", 2, _pem(_party_cert("alice", mallory_old.public_key(), ca_cert.subject,
                                                            ca_key, [], 1)), mallory_old, mallory_new.public_key())
        forged = type(forged)(forged.party, forged.sequence, forged.issued_at,
                              x509.load_pem_x509_certificate(new_pem).public_bytes(serialization.Encoding.DER),
                              forged.new_key, forged.signature)  # claims to replace alice's current certificate
        cert = _party_cert("alice", mallory_new.public_key(), ca_cert.subject, ca_key, [], 1, ca_cert.public_key(),
                           extensions=[x509.UnrecognizedExtension(ROTATION_OID, forged.to_bytes())])
        (tmp_path / "mallory").mkdir()
        (tmp_path / "mallory/m.pem").write_bytes(_pem(cert))
        (tmp_path / "mallory/m.key").write_bytes(_key_pem(mallory_new))
        _refused(bob_addr, bob_pin, tmp_path / "certs/ca.pem", tmp_path / "mallory/m", "signature does not verify")
        assert any("signature does not verify" in r for c, d, r in _rows(bob_cfg, "(identity)"))  # audited
        st = (tmp_path / "bob/ckpt/rotations.json").read_text()
        assert new_pin in st and fingerprints(_pem(cert))[0] not in st  # bob still pins alice's real new key

        # attack 3: the old statement replayed (a file delivered again) is refused
        r = CliRunner().invoke(app, ["party", "accept-rotation", str(tmp_path / "certs/alice-rotation-1.json"),
                                     str(bob_cfg)], env={"COLUMNS": "200"})
        assert r.exit_code != 0 and "not the certificate pinned for 'alice'" in f"{r.output}{r.exception}", r.output
        assert not (tmp_path / "bob/ckpt/rotations-inbox").exists()  # nothing reached the inbox
    finally:
        _run.split.stop()
    _bit_identical(tmp_path, uninterrupted)
    assert_split_equals_monolithic(tmp_path, STEPS, EVAL_EVERY)


@pytest.mark.slow
def test_bob_and_the_driver_rotate_mid_run_and_everyone_follows(tmp_path: Path, uninterrupted) -> None:
    try:
        applied = _run(tmp_path, "bob", operator_at=5)
        new_pin = cert_fingerprint((tmp_path / "certs/bob.pem").read_bytes())
        op_pin = cert_fingerprint((tmp_path / "certs/operator.pem").read_bytes())
        assert applied == {"alice": list(range(STEPS)), "bob": list(range(STEPS))}  # (steps 0..STEPS-1 applied)
        # alice's link to bob (her client) and the driver re-checked bob's new server certificate and followed it
        rot = _rows(_run.split.party_configs["alice"], "(rotation)")
        assert any(c == "bob" and "rotation #1 accepted" in r and new_pin in r for c, d, r in rot), rot
        assert new_pin in (tmp_path / "driver/rotations/bob.json").read_text()
        # the driver dialled on with its new key, and both parties followed the operator's statement
        for p in ("alice", "bob"):
            rot = _rows(_run.split.party_configs[p], "(rotation)")
            assert any(c == "operator" and "rotation #1 accepted" in r and op_pin in r for c, d, r in rot), (p, rot)
    finally:
        _run.split.stop()
    _bit_identical(tmp_path, uninterrupted)
