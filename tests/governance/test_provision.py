"""`party provision` (issue #27): CONSORTIUM.toml -> one signed kit per party, with identities made on the
parties' own hosts (certificate or CSR) or, flagged, by the provisioner; bad consortium files name the field and the
choices; the kit's checks before start (key on this host, deny-list seeded); the client-side deny-list check."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from modelward.core.config import to_toml
from modelward.errors import ConfigError
from modelward.governance.party.config import load_party_config, revoked_path
from modelward.governance.provisioning import open_party_kit, provision
from modelward.governance.trust.certs import ca_init, keygen
from modelward.governance.trust.identity import cert_fingerprint, public_key_fingerprint
from modelward.governance.trust.manifest import KitError, verify_kit
from modelward.governance.trust.revocation import DenyList, RevokedPeer, revoke, revoked_server_check

DIGITS = {"source": "digits", "seed": 0}
REVOKED = "sha256:" + "c" * 64


def consortium(**identities) -> dict:
    """A two-party digits consortium (tiny CNN); `identities` gives each party's identity keys."""
    ident = {n: {"generate": True} for n in ("alice", "bob", "operator")} | identities
    return {
        "name": "test-consortium", "input_shape": [1, 8, 8], "num_classes": 10,
        "model": {"arch": "cnn", "channels": [4, 8], "fc": 16}, "revoked": [REVOKED],
        "parties": [
            {"name": "alice", "role": "inputs", "address": "127.0.0.1:50061", "layers": ["conv1"],
             "policy": {"allow_peers": ["operator"], "training": True}, "data": {"dataset": DIGITS}, **ident["alice"]},
            {"name": "bob", "role": "labels", "address": "127.0.0.1:50062", "layers": ["conv2", "fc1", "logits"],
             "policy": {"allow_peers": ["alice", "operator"], "training": True}, "data": {"dataset": DIGITS},
             **ident["bob"]},
            {"name": "operator", "role": "driver", **ident["operator"]},
        ],
        "train": {"steps": 3, "batch_size": 16},
    }


def write(path: Path, data: dict) -> Path:
    path.write_text(to_toml(data))
    return path


def test_kits_from_certificates_and_csrs_made_on_the_parties_hosts(tmp_path):
    """The default flow: alice and the operator send certificates from `party keygen`, bob a CSR signed by the
    consortium CA; no private key is in any kit, and each kit names where the key is on the party's host."""
    hosts = {n: tmp_path / f"host_{n}" for n in ("alice", "bob", "operator")}
    for n, h in hosts.items():
        keygen(n, h / "keys")
    ca_init(tmp_path / "prov" / "ca", "Consortium")
    cfg = consortium(alice={"cert": str(hosts["alice"] / "keys/alice.pem")},
                     bob={"csr": str(hosts["bob"] / "keys/bob.csr")},
                     operator={"cert": str(hosts["operator"] / "keys/operator.pem")})
    cfg["ca"] = "ca"
    res = provision(write(tmp_path / "prov" / "consortium.toml", cfg), tmp_path / "kits")
    assert res.generated == [] and res.key_created and sorted(res.kits) == ["alice", "bob", "operator"]
    assert (tmp_path / "prov" / "consortium-signing.key").stat().st_mode & 0o777 == 0o600
    for n, kit in res.kits.items():
        m = verify_kit(kit, res.key_fingerprint, party=n)
        assert not m.dev_generated_key and not any(f.endswith(".key") for f in m.files)
        assert "DEV/TEST" not in (kit / "README.md").read_text()
    alice = tomllib.loads((res.kits["alice"] / "party.toml").read_text())
    bob_pem = (res.kits["bob"] / "bob.pem").read_bytes()  # signed here by the consortium CA from bob's CSR
    assert alice["peers"]["bob"] == {"fingerprint": cert_fingerprint(bob_pem), "address": "127.0.0.1:50062"}
    assert public_key_fingerprint(bob_pem) == public_key_fingerprint((hosts["bob"] / "keys/bob.csr").read_bytes())
    assert alice["tls"]["key"] == "../keys/alice.key" and alice["next"] == "bob" and alice["driver"] == "operator"
    split = tomllib.loads((res.kits["operator"] / "split.toml").read_text())
    assert [p["name"] for p in split["parties"]] == ["alice", "bob"] and split["train"]["steps"] == 3
    # the trust bundle: alice's self-signed certificate (cross-pinning) and the CA that signed bob's
    bundle = (res.kits["operator"] / "ca.pem").read_bytes()
    assert (tmp_path / "prov/ca/ca.pem").read_bytes() in bundle and (hosts["alice"] / "keys/alice.pem").read_bytes() \
        in bundle
    # the kit opens on bob's host (his key is there), with the consortium's deny-list merged into his own
    kit_bob = hosts["bob"] / "kit"
    res.kits["bob"].rename(kit_bob)
    toml, m = open_party_kit(kit_bob, res.key_fingerprint, "bob")
    assert m.party == "bob"
    assert DenyList(revoked_path(load_party_config(toml))).reason(REVOKED) is not None
    # ... but not on alice's host: the key there is not bob's (a kit of another party, replayed)
    kit_alice_host = hosts["alice"] / "kit"
    kit_bob.rename(kit_alice_host)
    with pytest.raises(KitError, match="tls.key .* not found on this host"):
        open_party_kit(kit_alice_host, res.key_fingerprint)
    (hosts["alice"] / "keys/bob.key").write_bytes((hosts["alice"] / "keys/alice.key").read_bytes())
    with pytest.raises(KitError, match="does not belong to the kit's certificate"):
        open_party_kit(kit_alice_host, res.key_fingerprint)
    with pytest.raises(KitError, match="a kit's configuration is signed"):
        open_party_kit(kit_alice_host, res.key_fingerprint, overrides=["policy.max_batch=100000"])
    with pytest.raises(ConfigError, match="exists; refusing to overwrite a kit"):
        provision(tmp_path / "prov" / "consortium.toml", tmp_path / "kits")


def test_generated_keys_are_flagged_and_kept_private(tmp_path):
    res = provision(write(tmp_path / "c.toml", consortium()), tmp_path / "kits")
    assert res.generated == ["alice", "bob", "operator"]
    m = verify_kit(res.kits["alice"], res.key_fingerprint)
    assert m.dev_generated_key and "alice.key" in m.files
    assert (res.kits["alice"] / "alice.key").stat().st_mode & 0o777 == 0o600
    assert "DEV/TEST KIT" in (res.kits["alice"] / "README.md").read_text()
    # re-provisioning with --force keeps the consortium key (same fingerprint) and replaces the kits
    again = provision(tmp_path / "c.toml", tmp_path / "kits", force=True)
    assert again.key_fingerprint == res.key_fingerprint and not again.key_created
    assert sorted(p.name for p in (tmp_path / "kits").iterdir()) == ["alice", "bob", "operator"]


@pytest.mark.parametrize("change, match", [
    (lambda c: c["parties"][0].update(role="owner"),
     "field 'parties.0.role': got 'owner'; valid choices: 'inputs', 'middle', 'labels' or 'driver'"),
    (lambda c: c["parties"][0].pop("generate"), "give exactly one identity: cert ="),
    (lambda c: c["parties"][1].update(cert="bob.pem"), "give exactly one identity"),
    (lambda c: c["parties"].append({"name": "op2", "role": "driver", "generate": True}),
     "exactly one party has role = \"driver\""),
    (lambda c: c["parties"].reverse(), "must be one role = \"inputs\" first"),
    (lambda c: c["parties"][1].update(address="bob-host"), "expected host:port"),
    (lambda c: c["parties"][0].update(layers=["conv1", "conv2"]), "parties.\\*.layers: the parties' layers"),
    (lambda c: c["parties"][0].update(layers=["conv9"]), "parties.alice.layers"),
    (lambda c: c["parties"][1].update(csr="bob.csr", generate=False), "ca: a party gives a csr"),
    (lambda c: c["parties"][0].update(settings={"tls": {}}), r"settings: \['tls'\] are set by the provisioner"),
    (lambda c: c["parties"][0]["policy"].update(allow_peers=["mallory"]), r"allow_peers: \['mallory'\] are not"),
    (lambda c: c["parties"][0].update(settings={"max_batchh": 3}), "max_batchh.*unknown field.*'max_batch'"),
    (lambda c: c.update(revoked=["nonsense"]), "revoked\\[0\\]"),
    (lambda c: c.update(colour="red"), "field 'colour': unknown field"),
])
def test_a_malformed_consortium_file_names_the_field(tmp_path, change, match):
    cfg = consortium()
    change(cfg)
    with pytest.raises(ConfigError, match=match):
        provision(write(tmp_path / "c.toml", cfg), tmp_path / "kits")
    assert not (tmp_path / "kits").exists() or not any((tmp_path / "kits").iterdir())  # nothing half-written


def test_the_client_side_check_refuses_a_revoked_server_by_any_of_its_fingerprints(tmp_path):
    paths = keygen("bob", tmp_path)
    pem = paths["cert"].read_bytes()
    deny = DenyList(tmp_path / "revoked.txt")
    check = revoked_server_check(deny)
    check("bob", "h:1", cert_fingerprint(pem), pem)  # nothing revoked
    check("bob", "h:1", None, None)
    revoke(deny.path, public_key_fingerprint(pem), "bob")  # revoked by its key, pinned by its certificate
    with pytest.raises(RevokedPeer, match="party bob at h:1 is refused by this side: its certificate spki-sha256"):
        check("bob", "h:1", cert_fingerprint(pem), pem)
    with pytest.raises(RevokedPeer):
        check("bob", "h:1", public_key_fingerprint(pem), None)  # the pin alone, before any handshake


def test_one_rule_for_every_command_started_on_a_config(tmp_path, monkeypatch):
    """`party serve` and `split train` (and its --host party) use a configuration in a kit only once the kit
    verifies; with a consortium key on the host they use kits only; a kit takes no --set."""
    import subprocess

    from typer.testing import CliRunner

    from modelward.cli.split import app as split_app
    from modelward.governance.trust.manifest import ENV_KEY, check_kit_of

    monkeypatch.delenv(ENV_KEY, raising=False)
    monkeypatch.delenv("MODELWARD_PARTY", raising=False)
    res = provision(write(tmp_path / "c.toml", consortium()), tmp_path / "kits")
    split = res.kits["operator"] / "split.toml"
    plain = tmp_path / "plain.toml"
    plain.write_text(split.read_text())
    assert check_kit_of(plain) is None
    with pytest.raises(KitError, match="not a kit .* this host uses verified kits only"):
        check_kit_of(plain, res.key_fingerprint)
    with pytest.raises(KitError, match="give the consortium key"):
        check_kit_of(split)
    with pytest.raises(KitError, match="--set train.steps=9: a kit's configuration is signed"):
        check_kit_of(split, res.key_fingerprint, None, ["train.steps=9"])
    monkeypatch.setenv(ENV_KEY, res.key_fingerprint)
    assert check_kit_of(split).party == "operator"
    with pytest.raises(KitError, match="this kit is for party 'operator', not 'alice'"):
        check_kit_of(split, None, "alice")
    # the driver's kit, tampered: `split train` refuses it before dialling anyone
    text = split.read_text()
    split.write_text(text.replace('name = "bob"', 'name = "bob"\nfingerprint_note = 1', 1))
    r = CliRunner().invoke(split_app, ["train", str(split)])
    assert isinstance(r.exception, KitError) and "file split.toml was changed" in str(r.exception)
    split.write_text(text)
    r = CliRunner().invoke(split_app, ["train", str(split), "--host", str(tmp_path / "kits/bob/party.toml"),
                                       "--consortium-key", "spki-sha256:" + "0" * 64])
    assert isinstance(r.exception, KitError) and "not the expected spki-sha256:000" in str(r.exception)
    # start.sh never carries the key it is checked against: without it, it stops before running anything
    monkeypatch.delenv(ENV_KEY)
    out = subprocess.run(["sh", str(res.kits["bob"] / "start.sh")], capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "set MODELWARD_CONSORTIUM_KEY to the consortium key fingerprint" in out.stderr


def test_a_middle_party_pins_its_two_neighbours_and_the_driver_and_the_cli_prints_the_key(tmp_path):
    from typer.testing import CliRunner

    from modelward.cli.party import app as party_app

    cfg = consortium()
    cfg["model"] = {"arch": "mlp", "hidden": [8, 8]}
    cfg["input_shape"] = [64]
    layers = ["fc1", "fc2", "logits"]
    cfg["parties"][0]["layers"], cfg["parties"][1]["layers"] = layers[:1], layers[2:]
    cfg["parties"].insert(1, {"name": "carol", "role": "middle", "address": "127.0.0.1:50063", "layers": layers[1:2],
                              "generate": True, "policy": {"allow_peers": ["alice", "operator"], "training": True}})
    cfg["parties"][2]["policy"]["allow_peers"] = ["carol", "operator"]
    write(tmp_path / "c.toml", cfg)
    r = CliRunner().invoke(party_app, ["provision", str(tmp_path / "c.toml"), "--out", str(tmp_path / "kits")])
    assert r.exit_code == 0, r.output
    fp = next(ln.split(": ", 1)[1] for ln in r.output.splitlines() if ln.startswith("consortium key fingerprint"))
    assert "WARNING: dev/test kits for alice, carol, bob, operator" in r.output
    carol = tomllib.loads((tmp_path / "kits/carol/party.toml").read_text())
    assert (carol["prev"], carol["next"], sorted(carol["peers"])) == ("alice", "bob", ["alice", "bob", "operator"])
    assert "data" not in carol and carol["peers"]["bob"]["address"] == "127.0.0.1:50062"
    bob = tomllib.loads((tmp_path / "kits/bob/party.toml").read_text())
    assert bob["prev"] == "carol" and "next" not in bob and sorted(bob["peers"]) == ["carol", "operator"]
    r = CliRunner().invoke(party_app, ["verify-kit", str(tmp_path / "kits/carol"), "--consortium-key", fp,
                                       "--party", "carol"])
    assert r.exit_code == 0 and "kit OK: carol (middle) of consortium test-consortium" in r.output, r.output
    assert "DEV/TEST kit" in r.output


def test_a_certificate_made_out_to_another_name_or_expired_is_refused(tmp_path):
    old = keygen("alice", tmp_path / "old", days=0)["cert"]  # valid until 5 minutes ago (clock-skew margin)
    other = keygen("mallory", tmp_path / "m")["cert"]
    with pytest.raises(ConfigError, match="parties.alice: the certificate expired on"):
        provision(write(tmp_path / "c.toml", consortium(alice={"cert": str(old)})), tmp_path / "kits")
    with pytest.raises(ConfigError, match=r"parties.alice: the certificate is made out to \['mallory'\]"):
        provision(write(tmp_path / "c.toml", consortium(alice={"cert": str(other)})), tmp_path / "kits")


def test_a_client_refuses_a_revoked_pin_before_connecting(tmp_path):
    """A GrpcPartyClient with the deny-list hook raises RevokedPeer, not PartyUnavailable, for a revoked pin
    whose address nothing listens on: the check comes before any connection."""
    from modelward.governance.party.config import TLSConfig
    from modelward.governance.transport.client import GrpcPartyClient
    from modelward.governance.wire import Message

    me = keygen("alice", tmp_path / "a")
    bob = keygen("bob", tmp_path / "b")["cert"].read_bytes()
    deny = DenyList(tmp_path / "revoked.txt")
    tls = TLSConfig(ca=str(tmp_path / "b/bob.pem"), cert=str(me["cert"]), key=str(me["key"]))
    with socket_free_port() as port:
        c = GrpcPartyClient("bob", f"127.0.0.1:{port}", tls, cert_fingerprint(bob), timeout=5,
                            peer_check=revoked_server_check(deny))
        revoke(deny.path, cert_fingerprint(bob), "bob")
        with pytest.raises(RevokedPeer, match=f"party bob at 127.0.0.1:{port} is refused by this side"):
            c.call(Message("status"))
        c.close()


def socket_free_port():
    import contextlib
    import socket

    @contextlib.contextmanager
    def port():
        with socket.socket() as s:  # bound, not listening: a connection would be refused
            s.bind(("127.0.0.1", 0))
            yield s.getsockname()[1]

    return port()


def test_the_shipped_example_consortium_file_is_valid():
    from modelward.core.config import load_config
    from modelward.governance.provisioning import ConsortiumConfig, _check_layers

    path = Path(__file__).resolve().parents[2] / "examples" / "consortium_digits.toml"
    cfg = load_config(path, ConsortiumConfig)
    _check_layers(cfg, str(path))
    assert [(p.name, p.role) for p in cfg.parties] == [("alice", "inputs"), ("bob", "labels"), ("operator", "driver")]
    assert not any(p.generate for p in cfg.parties)  # the documented flow: certificates made on the parties' hosts
