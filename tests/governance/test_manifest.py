"""Signed kit manifests (issue #27): every file hashed, the manifest signed with the consortium's Ed25519 key, and
a kit refused - one line naming the file - when anything was changed, added, removed, re-signed or replayed."""

from __future__ import annotations

import json
import os
import stat

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from modelward.errors import ConfigError
from modelward.governance.trust.manifest import (
    MANIFEST,
    SIGNATURE,
    KitError,
    expected_key_fingerprint,
    key_fingerprint,
    load_or_create_signing_key,
    verify_kit,
    write_manifest,
)


@pytest.fixture()
def kit(tmp_path):
    key, created = load_or_create_signing_key(tmp_path / "prov" / "consortium.key")
    assert created
    k = tmp_path / "kit"
    (k / "peers").mkdir(parents=True)
    (k / "party.toml").write_text('name = "bob"\n')
    (k / "policy.toml").write_text("training = true\n")
    (k / "peers" / "alice.pem").write_text("alice's certificate\n")
    write_manifest(k, key, consortium="c1", party="bob", role="labels")
    return k, key


def test_a_signed_kit_verifies_and_names_what_it_holds(kit, tmp_path):
    k, key = kit
    fp = key_fingerprint(key.public_key())
    m = verify_kit(k, fp, party="bob")
    assert (m.party, m.role, m.consortium, m.dev_generated_key) == ("bob", "labels", "c1", False)
    assert sorted(m.files) == ["party.toml", "peers/alice.pem", "policy.toml"]
    assert m.created.endswith("Z")
    # the public key file written next to the signing key is accepted in place of the fingerprint
    pub = tmp_path / "prov" / "consortium.key.pub"
    assert expected_key_fingerprint(str(pub)) == fp
    assert verify_kit(k, str(pub)).party == "bob"


@pytest.mark.parametrize("attack, match", [
    ("changed policy", "file policy.toml was changed"),
    ("added file", "extra file peers/mallory.pem is not in MANIFEST.json"),
    ("missing file", "file peers/alice.pem listed in MANIFEST.json is missing"),
    ("symlink", "peers/alice.pem is a symbolic link"),
    ("edited manifest", "MANIFEST.sig: the signature of MANIFEST.json does not verify"),
    ("re-signed", "signed by consortium key spki-sha256:[0-9a-f]+, not the expected"),
    ("another party", "this kit is for party 'bob', not 'alice'"),
    ("no signature", "MANIFEST.sig is missing"),
    ("escaping path", "lists '../outside.txt', which is not a file inside the kit"),
])
def test_every_tampering_is_refused_naming_the_file(kit, tmp_path, attack, match):
    k, key = kit
    fp = key_fingerprint(key.public_key())
    party = None
    if attack == "changed policy":
        (k / "policy.toml").write_text("training = true\nmax_batch = 100000\n")
    elif attack == "added file":
        (k / "peers" / "mallory.pem").write_text("x")
    elif attack == "missing file":
        (k / "peers" / "alice.pem").unlink()
    elif attack == "symlink":
        (k / "peers" / "alice.pem").unlink()
        (tmp_path / "elsewhere.pem").write_text("alice's certificate\n")
        os.symlink(tmp_path / "elsewhere.pem", k / "peers" / "alice.pem")
    elif attack == "edited manifest":  # the hash of a changed file put into the manifest by hand
        m = json.loads((k / MANIFEST).read_text())
        m["files"]["policy.toml"] = "sha256:" + "0" * 64
        (k / MANIFEST).write_text(json.dumps(m))
    elif attack == "re-signed":  # a changed kit re-signed, consistently, with the attacker's own key
        (k / "policy.toml").write_text("training = true\nmax_batch = 100000\n")
        write_manifest(k, Ed25519PrivateKey.generate(), consortium="c1", party="bob", role="labels")
    elif attack == "another party":
        party = "alice"
    elif attack == "no signature":
        (k / SIGNATURE).unlink()
    elif attack == "escaping path":  # even a validly signed manifest may not point outside the kit
        (tmp_path / "outside.txt").write_text("x")
        m = json.loads((k / MANIFEST).read_text())
        m["files"]["../outside.txt"] = "sha256:" + "0" * 64
        data = json.dumps(m).encode()
        (k / MANIFEST).write_bytes(data)
        import base64
        (k / SIGNATURE).write_text(base64.b64encode(key.sign(data)).decode())
    with pytest.raises(KitError, match=match) as e:
        verify_kit(k, fp, party=party)
    assert "\n" not in str(e.value)  # one line


def test_the_expected_key_is_a_public_key_pin_or_file(tmp_path):
    with pytest.raises(ConfigError, match="pinned by its public key, 'spki-sha256"):
        expected_key_fingerprint("sha256:" + "a" * 64)
    with pytest.raises(ConfigError, match="neither a fingerprint 'spki-sha256:<64 hex>' nor an existing"):
        expected_key_fingerprint("nonsense")
    with pytest.raises(ConfigError, match="--consortium-key"):
        expected_key_fingerprint("spki-sha256:abc")


def test_the_signing_key_is_private_from_creation_and_refused_when_readable(tmp_path):
    path = tmp_path / "consortium.key"
    key, created = load_or_create_signing_key(path)
    assert created and stat.S_IMODE(path.stat().st_mode) == 0o600
    again, created2 = load_or_create_signing_key(path)
    assert not created2 and key_fingerprint(again.public_key()) == key_fingerprint(key.public_key())
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        load_or_create_signing_key(path)
    other = tmp_path / "ec.key"
    from cryptography.hazmat.primitives.asymmetric import ec
    ec_key = ec.generate_private_key(ec.SECP256R1())
    other.write_bytes(ec_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    os.chmod(other, 0o600)
    with pytest.raises(ConfigError, match="must be Ed25519"):
        load_or_create_signing_key(other)
