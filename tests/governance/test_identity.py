import subprocess

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from modelward.errors import ConfigError, IdentityError, ModelwardError
from modelward.governance.trust.certs import make_certs
from modelward.governance.trust.identity import (
    cert_fingerprint,
    identify_peer,
    normalize_fingerprint,
    peer_pem_from_auth_context,
    public_key_fingerprint,
)


@pytest.fixture(scope="module")
def two_orgs(tmp_path_factory):
    """Two organisations, each with its own CA; Bob's CA also issues a certificate named `alice`."""
    a = tmp_path_factory.mktemp("org_a")
    b = tmp_path_factory.mktemp("org_b")
    make_certs(a, ["alice"], ca_name="org-a-ca")
    make_certs(b, ["bob", "alice"], ca_name="org-b-ca")
    return a, b


def test_fingerprint_is_sha256_of_der(two_orgs):
    a, _ = two_orgs
    pem = (a / "alice.pem").read_bytes()
    fp = cert_fingerprint(pem)
    assert fp.startswith("sha256:") and len(fp) == 7 + 64
    der = x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)
    assert cert_fingerprint(der) == fp  # DER accepted too
    # equal to what openssl prints (when openssl is installed)
    try:
        out = subprocess.run(["openssl", "x509", "-noout", "-fingerprint", "-sha256", "-in", str(a / "alice.pem")],
                             capture_output=True, text=True, check=True).stdout
    except (FileNotFoundError, subprocess.CalledProcessError):
        return
    assert normalize_fingerprint("sha256:" + out.strip().split("=", 1)[1]) == fp


def test_public_key_fingerprint_same_for_cert_and_key(two_orgs):
    a, _ = two_orgs
    fp = public_key_fingerprint((a / "alice.pem").read_bytes())
    assert fp.startswith("spki-sha256:")
    assert public_key_fingerprint((a / "alice.key").read_bytes()) == fp
    assert fp != public_key_fingerprint((a / "ca.pem").read_bytes())


def test_identify_by_pin_not_by_common_name(two_orgs):
    a, b = two_orgs
    real_alice = (a / "alice.pem").read_bytes()
    fake_alice = (b / "alice.pem").read_bytes()  # valid cert named alice, issued by Bob's CA
    bob = (b / "bob.pem").read_bytes()
    pins = {"alice": cert_fingerprint(real_alice), "bob": public_key_fingerprint(bob)}
    assert identify_peer(real_alice, pins) == "alice"
    assert identify_peer(bob, pins) == "bob"
    with pytest.raises(IdentityError) as e:
        identify_peer(fake_alice, pins)
    assert cert_fingerprint(fake_alice) in str(e.value) and "'alice'" in str(e.value)
    assert isinstance(e.value, ModelwardError)
    # pins in openssl's colon upper-case form are accepted
    colon = "sha256:" + ":".join(cert_fingerprint(real_alice)[7:][i:i + 2].upper() for i in range(0, 64, 2))
    assert identify_peer(real_alice, {"alice": colon}) == "alice"


def test_no_certificate_and_garbage_are_identity_errors():
    with pytest.raises(IdentityError, match="no peer certificate"):
        identify_peer(b"", {})
    with pytest.raises(IdentityError, match="not a valid X.509"):
        identify_peer(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", {})


def test_bad_pins_are_config_errors(two_orgs):
    a, b = two_orgs
    pem = (a / "alice.pem").read_bytes()
    with pytest.raises(ConfigError, match=r"pins\.bob.*spki-sha256"):
        identify_peer(pem, {"bob": "md5:abcd"})
    fp = cert_fingerprint(pem)
    with pytest.raises(ConfigError, match="same fingerprint"):
        identify_peer(pem, {"alice": fp, "carol": fp.upper().replace("SHA256", "sha256")})
    with pytest.raises(ConfigError, match="own key"):
        identify_peer(pem, {"alice": fp, "carol": public_key_fingerprint(pem)})


def test_peer_pem_from_auth_context():
    assert peer_pem_from_auth_context({"x509_pem_cert": [b"PEM"]}) == b"PEM"
    assert peer_pem_from_auth_context({}) == b""
