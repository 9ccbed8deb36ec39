"""Key rotation statements (issue #27): what a verifier accepts, and every forgery, replay and stale key it refuses."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from modelward.errors import ConfigError, IdentityError
from modelward.governance.transport.credentials import KeyPairFiles
from modelward.governance.trust.certs import _load_ca, _party_cert, _pem, keygen, make_certs
from modelward.governance.trust.identity import cert_fingerprint, public_key_fingerprint
from modelward.governance.trust.revocation import DenyList, read_deny_list, revoke
from modelward.governance.trust.rotation import (
    ROTATION_OID,
    PeerTrust,
    RotationError,
    RotationStatement,
    RotationStore,
    deliver_statement,
    read_statement_file,
    rotate_keys,
    sign_statement,
    statement_from_cert,
    switch_staged,
    verify_statement,
)


@pytest.fixture()
def ca(tmp_path: Path) -> Path:
    make_certs(tmp_path / "certs", ["alice", "bob"])
    return tmp_path / "certs"


def _key(path: Path):
    return serialization.load_pem_private_key(path.read_bytes(), password=None)


def _trust(tmp_path: Path, ca: Path, overlap_s: float = 0.0, **kw) -> PeerTrust:
    pins = {p: cert_fingerprint((ca / f"{p}.pem").read_bytes()) for p in ("alice", "bob")}
    return PeerTrust(pins, RotationStore(tmp_path / "state/rotations.json"), DenyList(tmp_path / "state/revoked.txt"),
                     overlap_s, **kw)


def test_a_rotated_certificate_carries_a_statement_that_verifies_against_the_old_pin(ca: Path) -> None:
    old_pem = (ca / "alice.pem").read_bytes()
    res = rotate_keys("alice", ca / "alice.key", ca / "alice.pem", ca_dir=ca)
    new_pem = (ca / "alice.pem").read_bytes()
    st = statement_from_cert(new_pem)
    assert st is not None and st.party == "alice" and st.sequence == 1
    assert verify_statement(st, new_pem, cert_fingerprint(old_pem)) == cert_fingerprint(new_pem) == res.new_pin
    assert verify_statement(st, new_pem, public_key_fingerprint(old_pem))  # a key pin works too
    assert oct(os.stat(ca / "alice.key").st_mode & 0o777) == "0o600"
    assert public_key_fingerprint((ca / "alice.key").read_bytes()) == public_key_fingerprint(new_pem)
    # the file form is the same statement, with the new certificate
    f_st, f_cert = read_statement_file(res.statement_path)
    assert f_st == st and f_cert == new_pem
    # the next rotation continues the sequence and is signed by the key that is now current
    rotate_keys("alice", ca / "alice.key", ca / "alice.pem", ca_dir=ca)
    st2 = statement_from_cert((ca / "alice.pem").read_bytes())
    assert st2.sequence == 2 and verify_statement(st2, (ca / "alice.pem").read_bytes(), res.new_pin, 1)


def test_forged_tampered_replayed_and_future_statements_are_refused(ca: Path) -> None:
    old_pem = (ca / "alice.pem").read_bytes()
    pin = cert_fingerprint(old_pem)
    new = ec.generate_private_key(ec.SECP256R1())
    ca_key, ca_cert = _load_ca(ca)
    new_pem = _pem(_party_cert("alice", new.public_key(), ca_cert.subject, ca_key, [], 1))
    good = sign_statement("alice", 1, old_pem, _key(ca / "alice.key"), new.public_key())
    assert verify_statement(good, new_pem, pin) == cert_fingerprint(new_pem)
    # signed by a different key (bob's, or an attacker's) while naming alice's old certificate
    other = sign_statement("alice", 1, (ca / "bob.pem").read_bytes(), _key(ca / "bob.key"), new.public_key())
    forged = RotationStatement("alice", 1, good.issued_at, good.old_cert, good.new_key, other.signature)
    with pytest.raises(RotationError, match="signature does not verify"):
        verify_statement(forged, new_pem, pin)
    # bob's key signing "his" statement for alice: the old certificate is not alice's pin
    with pytest.raises(RotationError, match="not the certificate pinned"):
        verify_statement(other, new_pem, pin)
    # a field changed after signing
    bumped = RotationStatement("alice", 7, good.issued_at, good.old_cert, good.new_key, good.signature)
    with pytest.raises(RotationError, match="signature does not verify"):
        verify_statement(bumped, new_pem, pin)
    # a statement for one key presented with another certificate
    with pytest.raises(RotationError, match="names the key"):
        verify_statement(good, (ca / "bob.pem").read_bytes(), pin)
    # replay: this sequence was accepted already
    with pytest.raises(RotationError, match="replay"):
        verify_statement(good, new_pem, pin, last_sequence=1)
    future = sign_statement("alice", 1, old_pem, _key(ca / "alice.key"), new.public_key(),
                            issued_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600)))
    with pytest.raises(RotationError, match="future"):
        verify_statement(future, new_pem, pin)
    with pytest.raises(RotationError, match="malformed"):
        RotationStatement.from_bytes(b'{"format": "modelward-rotation/1", "party": "alice"}')
    with pytest.raises(RotationError, match="malformed"):
        RotationStatement.from_bytes(json.dumps({**json.loads(good.to_bytes()), "sequence": -1}).encode())


def test_a_peer_follows_in_band_then_retires_the_old_key_onto_the_deny_list(tmp_path: Path, ca: Path) -> None:
    events: list[tuple[str, str, str]] = []
    trust = _trust(tmp_path, ca, overlap_s=0.3, on_event=lambda *e: events.append(e))
    old_pem = (ca / "alice.pem").read_bytes()
    (tmp_path / "old.pem").write_bytes(old_pem)
    assert trust.identify(old_pem) == "alice"
    rotate_keys("alice", ca / "alice.key", ca / "alice.pem", ca_dir=ca)
    new_pem = (ca / "alice.pem").read_bytes()
    assert trust.identify(new_pem) == "alice"  # followed: the statement in the certificate
    assert trust.pins["alice"] == cert_fingerprint(new_pem)
    assert trust.identify(old_pem) == "alice"  # within the overlap (requests in flight)
    time.sleep(0.35)
    with pytest.raises(IdentityError, match="revoked .*retired by rotation #1"):
        trust.identify(old_pem)
    revoked = read_deny_list(tmp_path / "state/revoked.txt")
    assert cert_fingerprint(old_pem) in revoked and public_key_fingerprint(old_pem) in revoked
    assert [e[1] for e in events] == ["allow", "allow"] and "accepted" in events[0][2] and "retired" in events[1][2]
    # a restart with the configuration still pinning the old certificate follows the store to the new one
    again = _trust(tmp_path, ca)
    assert again.pins["alice"] == cert_fingerprint(new_pem) and again.identify(new_pem) == "alice"
    with pytest.raises(IdentityError):
        again.identify(old_pem)


def test_replayed_rotation_and_rotation_back_to_a_retired_key_are_refused(tmp_path: Path, ca: Path) -> None:
    trust = _trust(tmp_path, ca)
    (tmp_path / "k0").mkdir()
    (tmp_path / "k0/alice.key").write_bytes((ca / "alice.key").read_bytes())
    rotate_keys("alice", ca / "alice.key", ca / "alice.pem", ca_dir=ca)
    first = (ca / "alice.pem").read_bytes()
    assert trust.identify(first) == "alice"
    rotate_keys("alice", ca / "alice.key", ca / "alice.pem", ca_dir=ca)
    second = (ca / "alice.pem").read_bytes()
    assert trust.identify(second) == "alice"
    # the first rotation's certificate again (someone kept key #1): retired, and its statement is a replay
    with pytest.raises(IdentityError):
        trust.identify(first)
    st = statement_from_cert(first)
    with pytest.raises(RotationError, match="revoked key"):
        trust.accept(st, first, in_use=True)
    # even without the deny-list, the statement replaces a pin that is not the current one
    with pytest.raises(RotationError, match="not the certificate pinned"):
        PeerTrust(dict(trust.pins), trust.store, None).accept(st, first, in_use=True)
    # a statement (signed by the current key) that "rotates" back to the original, retired key
    ca_key, ca_cert = _load_ca(ca)
    orig = _key(tmp_path / "k0/alice.key")
    back = sign_statement("alice", 3, second, _key(ca / "alice.key"), orig.public_key())
    back_pem = _pem(_party_cert("alice", orig.public_key(), ca_cert.subject, ca_key, [], 1, ca_cert.public_key(),
                                extensions=[x509.UnrecognizedExtension(ROTATION_OID, back.to_bytes())]))
    with pytest.raises(IdentityError, match="revoked"):
        trust.identify(back_pem)
    assert trust.pins["alice"] == cert_fingerprint(second)


def test_a_statement_cannot_take_another_partys_key_or_name_an_unpinned_party(tmp_path: Path, ca: Path) -> None:
    trust = _trust(tmp_path, ca)
    # alice "rotates" to a certificate for bob's key: refused (each party its own key)
    bob_key = _key(ca / "bob.key")
    st = sign_statement("alice", 1, (ca / "alice.pem").read_bytes(), _key(ca / "alice.key"), bob_key.public_key())
    with pytest.raises(RotationError, match="pinned for 'bob'"):
        trust.accept(st, (ca / "bob.pem").read_bytes(), in_use=True)
    make_certs(tmp_path / "c2", ["carol"])
    new = ec.generate_private_key(ec.SECP256R1())
    st = sign_statement("carol", 1, (tmp_path / "c2/carol.pem").read_bytes(), _key(tmp_path / "c2/carol.key"),
                        new.public_key())
    with pytest.raises(RotationError, match="not a pinned peer"):
        trust.accept(st, _pem(_party_cert("carol", new.public_key(), x509.Name([]), new, [], 1)), in_use=True)
    # an unpinned certificate without a statement: refused with the usual message
    with pytest.raises(IdentityError, match="not pinned and carries no rotation statement"):
        trust.identify((tmp_path / "c2/carol.pem").read_bytes())


def test_cross_pinning_stages_the_pair_and_peers_pick_the_statement_up(tmp_path: Path) -> None:
    keygen("alice", tmp_path / "a")
    old_pem = (tmp_path / "a/alice.pem").read_bytes()
    res = rotate_keys("alice", tmp_path / "a/alice.key", tmp_path / "a/alice.pem", stage=True)
    assert (tmp_path / "a/alice.pem").read_bytes() == old_pem  # nothing switched yet
    state = tmp_path / "bob-state"
    pins = {"alice": cert_fingerprint(old_pem)}
    dest, party, seq = deliver_statement(res.statement_path, pins, state)
    assert (party, seq) == ("alice", 1) and dest.parent.name == "rotations-inbox"
    trust = PeerTrust(dict(pins), RotationStore(state / "rotations.json"), DenyList(state / "revoked.txt"), 0.0,
                      inbox=state / "rotations-inbox")
    assert trust.pick_up() == ["alice"]
    assert cert_fingerprint(trust.roots()) == res.new_pin  # the new self-signed certificate: a root for TLS
    assert trust.identify(old_pem) == "alice"  # the party has not switched yet: the old key is still good
    switch_staged(tmp_path / "a/alice.key", tmp_path / "a/alice.pem")
    new_pem = (tmp_path / "a/alice.pem").read_bytes()
    assert cert_fingerprint(new_pem) == res.new_pin and trust.identify(new_pem) == "alice"
    with pytest.raises(IdentityError, match="revoked"):  # first use of the new key retires the old one
        trust.identify(old_pem)
    # the same file delivered again is a replay
    with pytest.raises(RotationError, match="not the certificate pinned|replay"):
        deliver_statement(res.statement_path, pins, state)
    with pytest.raises(ConfigError, match="nothing staged"):
        switch_staged(tmp_path / "a/alice.key", tmp_path / "a/alice.pem")


def test_a_key_pair_switches_only_when_both_files_match(ca: Path) -> None:
    pair = KeyPairFiles(ca / "alice.key", ca / "alice.pem", min_interval_s=0)
    old = pair.current()
    new = ec.generate_private_key(ec.SECP256R1())
    ca_key, ca_cert = _load_ca(ca)
    (ca / "alice.pem").write_bytes(_pem(_party_cert("alice", new.public_key(), ca_cert.subject, ca_key, [], 1)))
    assert not pair.refresh() and pair.current() == old  # half-way: the certificate without its key
    (ca / "alice.key").write_bytes(new.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption()))
    os.utime(ca / "alice.key", ns=(time.time_ns(), time.time_ns() + 10**6))
    assert pair.refresh() and pair.version == 1
    assert pair.fingerprint == cert_fingerprint((ca / "alice.pem").read_bytes())
    with pytest.raises(ConfigError, match="does not belong"):
        KeyPairFiles(ca / "bob.key", ca / "alice.pem")


def test_a_revoked_party_cannot_rotate_itself_back_in(tmp_path: Path, ca: Path) -> None:
    """`party revoke alice` and then a statement signed by alice's (revoked, perhaps stolen) key: refused."""
    trust = _trust(tmp_path, ca)
    revoke(tmp_path / "state/revoked.txt", trust.pins["alice"], "alice")
    rotate_keys("alice", ca / "alice.key", ca / "alice.pem", ca_dir=ca)
    with pytest.raises(RotationError, match="signed by a revoked key"):
        trust.identify((ca / "alice.pem").read_bytes())
    assert trust.store.entries == {}


def test_a_live_grpc_server_takes_a_picked_up_self_signed_rotation_at_its_next_handshake(tmp_path: Path) -> None:
    """Cross-pinning over real gRPC mutual TLS: bob's server trusts alice's self-signed certificate only. Alice
    switching before bob has her statement is refused in the handshake; once the statement is in bob's inbox his
    dynamic credentials add her new certificate to the roots at the next handshake, bob identifies her new key as
    alice, and her old key is refused from then on."""
    from concurrent import futures

    import grpc

    from modelward.governance.party.config import TLSConfig
    from modelward.governance.transport.credentials import server_credentials

    keygen("alice", tmp_path / "a")
    keygen("bob", tmp_path / "b")
    a_old = tmp_path / "a-old"
    a_old.mkdir()
    for f in ("alice.pem", "alice.key"):
        (a_old / f).write_bytes((tmp_path / "a" / f).read_bytes())
    state = tmp_path / "bob-state"
    pins = {"alice": cert_fingerprint((tmp_path / "a/alice.pem").read_bytes())}
    trust = PeerTrust(dict(pins), RotationStore(state / "rotations.json"), DenyList(state / "revoked.txt"), 0.0,
                      inbox=state / "rotations-inbox")
    (tmp_path / "bob-ca.pem").write_bytes((tmp_path / "a/alice.pem").read_bytes())
    bob_tls = TLSConfig(ca=str(tmp_path / "bob-ca.pem"), cert=str(tmp_path / "b/bob.pem"),
                        key=str(tmp_path / "b/bob.key"))

    def who(request: bytes, context) -> bytes:
        pem = (context.auth_context().get("x509_pem_cert") or [b""])[0]
        try:
            return trust.identify(pem).encode()
        except IdentityError as e:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, str(e))

    server = grpc.server(futures.ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "t.T", {"Who": grpc.unary_unary_rpc_method_handler(who)}),))
    port = server.add_secure_port("127.0.0.1:0", server_credentials(bob_tls, KeyPairFiles(bob_tls.key, bob_tls.cert),
                                                                      trust))
    server.start()

    def call(folder: Path) -> str:
        creds = grpc.ssl_channel_credentials((tmp_path / "b/bob.pem").read_bytes(),
                                             (folder / "alice.key").read_bytes(), (folder / "alice.pem").read_bytes())
        with grpc.secure_channel(f"127.0.0.1:{port}", creds, options=[("grpc.ssl_target_name_override", "bob"),
                                                                       ("grpc.use_local_subchannel_pool", 1)]) as ch:
            try:
                return ch.unary_unary("/t.T/Who")(b"", timeout=5).decode()
            except grpc.RpcError as e:
                return e.code().name

    try:
        assert call(a_old) == "alice"
        res = rotate_keys("alice", tmp_path / "a/alice.key", tmp_path / "a/alice.pem", stage=True)
        switch_staged(tmp_path / "a/alice.key", tmp_path / "a/alice.pem")
        assert call(tmp_path / "a") == "UNAVAILABLE"  # switched too early: the handshake fails, nobody is misnamed
        deliver_statement(res.statement_path, pins, state)
        assert call(tmp_path / "a") == "alice"  # picked up before this handshake: new root, new pin
        assert trust.pins["alice"] == res.new_pin
        assert call(a_old) == "UNAUTHENTICATED"  # retired onto the deny-list at the new key's first use
    finally:
        server.stop(0)


def test_cli_rotate_stage_accept_and_switch(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from modelward.cli.main import app

    keygen("alice", tmp_path / "a")
    keygen("bob", tmp_path / "b")

    def toml(me: str, peer: str, folder: str, peer_folder: str) -> Path:
        p = tmp_path / f"party_{me}.toml"
        p.write_text(f'name = "{me}"\nlayers = ["fc1"]\ninput_shape = [4]\nnum_classes = 3\n'
                     f'checkpoint_dir = "{me}-ckpt"\naudit_db = "{me}.db"\n'
                     f'[tls]\nca = "{peer_folder}/{peer}.pem"\ncert = "{folder}/{me}.pem"\nkey = "{folder}/{me}.key"\n'
                     f'[peers.{peer}]\ncert = "{peer_folder}/{peer}.pem"\n')
        return p

    alice_toml = toml("alice", "bob", "a", "b")
    (tmp_path / "bob-copy").mkdir()  # bob's own copy of alice's certificate (what he pinned)
    (tmp_path / "bob-copy/alice.pem").write_bytes((tmp_path / "a/alice.pem").read_bytes())
    bob_toml = toml("bob", "alice", "b", "bob-copy")
    run = CliRunner()
    r = run.invoke(app, ["party", "rotate", str(alice_toml), "--stage"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "rotation #1 of alice" in r.output and "--switch" in r.output
    st = tmp_path / "a/alice-rotation-1.json"
    r = run.invoke(app, ["party", "accept-rotation", str(st), str(bob_toml)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, f"{r.output}{r.exception}"
    assert (tmp_path / "bob-ckpt/rotations-inbox/alice-rotation-1.json").is_file()
    # a statement for bob's own pin table from a party he does not pin: refused, nothing delivered
    r = run.invoke(app, ["party", "accept-rotation", str(st), str(alice_toml)], env={"COLUMNS": "200"})
    assert r.exit_code != 0 and "not a pinned peer" in f"{r.output}{r.exception}"
    r = run.invoke(app, ["party", "rotate", str(alice_toml), "--switch"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert statement_from_cert((tmp_path / "a/alice.pem").read_bytes()).sequence == 1


def test_a_remote_ca_signs_the_rotation_csr_and_the_statement_survives(tmp_path: Path) -> None:
    from modelward.governance.trust.certs import ca_init, ca_sign
    from modelward.governance.trust.rotation import install_signed

    ca_init(tmp_path / "ca", "Consortium")
    keys = keygen("alice", tmp_path / "a")
    ca_sign(tmp_path / "ca", keys["csr"], out=tmp_path / "a/alice.pem", force=True)  # alice's CA-signed certificate
    old_pem = (tmp_path / "a/alice.pem").read_bytes()
    trust = PeerTrust({"alice": cert_fingerprint(old_pem)}, RotationStore(None), None, 0.0)
    res = rotate_keys("alice", tmp_path / "a/alice.key", tmp_path / "a/alice.pem", csr=True)
    assert (tmp_path / "a/alice.pem").read_bytes() == old_pem and res.key.name == "alice.key.next"
    signed = ca_sign(tmp_path / "ca", res.csr)  # at the CA's host: only the CSR travels there
    pin = install_signed(tmp_path / "a/alice.key", tmp_path / "a/alice.pem", signed)
    new_pem = (tmp_path / "a/alice.pem").read_bytes()
    assert statement_from_cert(new_pem) == res.statement and cert_fingerprint(new_pem) == pin
    assert trust.identify(new_pem) == "alice" and trust.pins["alice"] == pin
    # a CA-signed certificate for another key is not installed over the staged one
    rotate_keys("alice", tmp_path / "a/alice.key", tmp_path / "a/alice.pem", csr=True)
    with pytest.raises(ConfigError, match="not a certificate for the staged key"):
        install_signed(tmp_path / "a/alice.key", tmp_path / "a/alice.pem", signed)
