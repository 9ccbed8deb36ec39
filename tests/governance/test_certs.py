import os
import stat

import pytest
from cryptography import x509

from modelward.errors import ConfigError
from modelward.governance.trust import certs as certs_mod
from modelward.governance.trust.certs import ca_init, ca_sign, keygen, make_certs, write_new_file
from modelward.governance.trust.identity import cert_fingerprint, public_key_fingerprint


def _cn(path):
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    return cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value


def test_certs_name_the_party_and_chain_to_the_ca(tmp_path):
    make_certs(tmp_path, ["alice", "bob"], hosts=["10.0.0.5", "bob.example.org"])
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.pem").read_bytes())
    bob = x509.load_pem_x509_certificate((tmp_path / "bob.pem").read_bytes())
    bob.verify_directly_issued_by(ca)
    san = bob.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"bob", "localhost", "bob.example.org"} <= set(san.get_values_for_type(x509.DNSName))
    assert {str(i) for i in san.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "10.0.0.5"}
    assert (tmp_path / "bob.key").stat().st_mode & 0o077 == 0


def test_bad_names(tmp_path):
    with pytest.raises(ConfigError, match="party name"):
        make_certs(tmp_path, ["Alice!"])
    with pytest.raises(ConfigError, match="distinct"):
        make_certs(tmp_path, ["a", "a"])
    with pytest.raises(ConfigError, match="CA name"):
        ca_init(tmp_path / "ca", "bad/name")


@pytest.fixture
def watch_creation(monkeypatch):
    """Record the permission bits of every file at the instant os.open creates it (before a byte is written), with
    umask 0 so nothing but the code's own mode can make it private; any chmod is an error."""
    created: dict[str, tuple[int, int]] = {}
    real_open = os.open

    def spy_open(path, flags, mode=0o777, *a, **k):
        fd = real_open(path, flags, mode, *a, **k)
        st = os.fstat(fd)
        created[os.path.basename(str(path))] = (stat.S_IMODE(st.st_mode), st.st_size)
        return fd

    def no_chmod(*a, **k):
        raise AssertionError("keys must be created private, not chmod-ed afterwards")

    monkeypatch.setattr(certs_mod.os, "open", spy_open)
    monkeypatch.setattr(certs_mod.os, "chmod", no_chmod)
    monkeypatch.setattr(certs_mod.os, "fchmod", no_chmod)
    old = os.umask(0)
    yield created
    os.umask(old)


def test_private_keys_are_0600_from_creation(tmp_path, watch_creation):
    keygen("alice", tmp_path / "a")
    ca_init(tmp_path / "ca", "Org A")
    make_certs(tmp_path / "demo", ["alice", "bob"])
    keygen("alice", tmp_path / "a", force=True)  # the replacement goes through a fresh private temp file
    keys = {n: v for n, v in watch_creation.items() if n.endswith(".key") or ".key." in n}
    assert {"alice.key", "ca.key", "bob.key"} <= set(keys) and any(n.startswith(".alice.key.") for n in keys)
    for name, (mode, size) in keys.items():
        assert mode == 0o600 and size == 0, (name, oct(mode), size)
    assert watch_creation["alice.pem"][0] == 0o644
    for p in [tmp_path / "a/alice.key", tmp_path / "ca/ca.key", tmp_path / "demo/bob.key"]:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600
    assert not list((tmp_path / "a").glob(".*tmp"))


def test_write_new_file_does_not_follow_a_planted_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "x.key").symlink_to(victim)
    with pytest.raises(ConfigError, match="exists"):
        write_new_file(tmp_path / "x.key", b"secret", 0o600)
    assert victim.read_text() == "keep"


def test_nothing_is_overwritten_without_force(tmp_path):
    a = keygen("alice", tmp_path / "a")
    key_before = a["key"].read_bytes()
    with pytest.raises(ConfigError, match=r"alice\.key exists.*--force"):
        keygen("alice", tmp_path / "a")
    assert a["key"].read_bytes() == key_before
    new = keygen("alice", tmp_path / "a", force=True)
    assert new["key"].read_bytes() != key_before
    assert public_key_fingerprint(new["key"].read_bytes()) == public_key_fingerprint(new["cert"].read_bytes())

    ca = ca_init(tmp_path / "ca", "Org A")
    ca_before = ca["cert"].read_bytes()
    with pytest.raises(ConfigError, match="refusing to replace the CA"):
        ca_init(tmp_path / "ca", "Org A")
    assert ca["cert"].read_bytes() == ca_before

    make_certs(tmp_path / "demo", ["alice", "bob"])
    demo_ca = (tmp_path / "demo/ca.pem").read_bytes()
    with pytest.raises(ConfigError, match="--force"):
        make_certs(tmp_path / "demo", ["alice", "bob"])
    assert make_certs(tmp_path / "demo", ["alice", "bob"], if_exists="reuse")["ca"].read_bytes() == demo_ca
    make_certs(tmp_path / "demo", ["alice", "bob"], if_exists="overwrite")
    assert (tmp_path / "demo/ca.pem").read_bytes() != demo_ca

    c = ca_sign(tmp_path / "ca", new["csr"], tmp_path / "signed.pem")
    with pytest.raises(ConfigError, match="exists"):
        ca_sign(tmp_path / "ca", new["csr"], c)


def test_ca_names_are_unique(tmp_path):
    make_certs(tmp_path / "x", ["alice"])
    make_certs(tmp_path / "y", ["alice"])
    ca_init(tmp_path / "c1", "Org")
    ca_init(tmp_path / "c2", "Org")
    names = {_cn(tmp_path / d / "ca.pem") for d in ("x", "y", "c1", "c2")}
    assert len(names) == 4


def test_ca_signs_a_csr_as_a_leaf_with_the_parties_key(tmp_path):
    ca = ca_init(tmp_path / "ca", "Consortium")
    bob = keygen("bob", tmp_path / "bob", hosts=["bob.example.org"])
    signed = ca_sign(tmp_path / "ca", bob["csr"])
    assert signed == tmp_path / "bob" / "bob-signed.pem"
    cert = x509.load_pem_x509_certificate(signed.read_bytes())
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca["cert"].read_bytes()))
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert "bob.example.org" in cert.extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert public_key_fingerprint(signed.read_bytes()) == public_key_fingerprint(bob["key"].read_bytes())
    assert cert_fingerprint(signed.read_bytes()).startswith("sha256:")
    # a tampered CSR is refused
    bad = tmp_path / "bad.csr"
    raw = bob["csr"].read_text().splitlines()
    mid = len(raw) // 2
    raw[mid] = raw[mid][:-4] + ("AAAA" if raw[mid][-4:] != "AAAA" else "BBBB")
    bad.write_text("\n".join(raw) + "\n")
    with pytest.raises(ConfigError):
        ca_sign(tmp_path / "ca", bad, tmp_path / "bad.pem")
