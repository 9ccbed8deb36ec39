"""A small certificate authority and per-party certificates for mutual TLS between parties.

Every party certificate is valid for both server and client authentication and names the party in its common
name and as a DNS subject-alternative name, so that a client can pin *which* party it is talking to (gRPC checks
the name via ``grpc.ssl_target_name_override``) and a server can identify its caller from the peer certificate.
Keys are ECDSA P-256; private keys are written with mode 0600.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from modelward.errors import ConfigError

NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise ConfigError(f"party name {name!r}: use 1-32 lower-case letters, digits, '-' or '_', starting with a letter")
    return name


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.write_bytes(data)
    if private:
        os.chmod(path, 0o600)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _san(name: str, hosts: list[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for h in [name, "localhost", "127.0.0.1", *hosts]:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            entries.append(x509.DNSName(h))
    unique = list(dict.fromkeys(entries))
    return x509.SubjectAlternativeName(unique)


def make_certs(out: str | Path, parties: list[str], hosts: list[str] | None = None, days: int = 365,
               ca_name: str = "modelward-ca") -> dict[str, Path]:
    """Write ca.pem/ca.key and <party>.pem/<party>.key for each party into `out`; return the paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if not parties:
        raise ConfigError("--parties: give at least one party name, e.g. alice,bob")
    for p in parties:
        check_name(p)
    if len(set(parties)) != len(parties):
        raise ConfigError(f"--parties: names must be distinct, got {parties}")
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_name)])
    ca_cert = (x509.CertificateBuilder().subject_name(ca_subject).issuer_name(ca_subject)
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now).not_valid_after(now + dt.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                            content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False, encipher_only=False,
                                            decipher_only=False), critical=True)
               .sign(ca_key, hashes.SHA256()))
    paths = {"ca": out / "ca.pem"}
    _write(out / "ca.pem", ca_cert.public_bytes(serialization.Encoding.PEM))
    _write(out / "ca.key", _key_pem(ca_key), private=True)
    for p in parties:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, p)]))
                .issuer_name(ca_subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now).not_valid_after(now + dt.timedelta(days=days))
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(_san(p, list(hosts or [])), critical=False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                      ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                .sign(ca_key, hashes.SHA256()))
        _write(out / f"{p}.pem", cert.public_bytes(serialization.Encoding.PEM))
        _write(out / f"{p}.key", _key_pem(key), private=True)
        paths[p] = out / f"{p}.pem"
    return paths


def read_pem(path: str | Path, what: str) -> bytes:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: {what} not found (make certificates with `modelward party certs`)")
    data = p.read_bytes()
    if b"-----BEGIN" not in data:
        raise ConfigError(f"{p}: {what} is not a PEM file")
    return data
