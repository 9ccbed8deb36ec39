import pytest
from cryptography import x509

from modelward.errors import ConfigError
from modelward.governance.certs import make_certs


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
