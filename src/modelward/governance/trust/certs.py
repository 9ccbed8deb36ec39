"""Keys and certificates for mutual TLS between parties, made by each organisation on its own host.

Three ways to get a party certificate (every one valid for server and client authentication, naming the party in
its common name and as a DNS subject-alternative name):

- **Cross-pinning** (no CA): each organisation runs ``modelward party keygen NAME --out DIR`` on its own host. It
  writes ``NAME.key`` (private, never leaves the host), a self-signed ``NAME.pem`` and ``NAME.csr``. The parties
  exchange their ``NAME.pem`` files, put the peer's certificate in their TLS trust bundle and pin its fingerprint
  (``modelward party fingerprint NAME.pem``).
- **Consortium CA**: one organisation (or each) runs ``modelward party ca init --out CADIR --name ORG``; parties
  send their ``NAME.csr`` and get back ``NAME-signed.pem`` from ``modelward party ca sign NAME.csr --ca CADIR``.
  Every CA gets a unique subject name (ORG plus a random suffix), so two organisations' CAs can share one bundle.
- **Demo** (one machine, quick start): ``modelward party certs`` makes a fresh uniquely-named CA and every party's
  key in one process. Fine for a loopback demo, not for two organisations.

Identity is decided by pinned fingerprints (``governance.trust.identity``), not by the common name. Private keys are ECDSA
P-256, created with ``os.open(O_CREAT | O_EXCL, 0o600)``, so they are never readable by others, not even for an
instant. Nothing that exists is overwritten unless ``force`` is given (then a fresh file replaces it atomically).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
import secrets
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from modelward.errors import ConfigError

NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
# a key-rotation statement (governance.trust.rotation) in a party's certificate or CSR: a UUID-derived OID (ITU-T
# X.667, arc 2.25: no registration, no collision); `ca_sign` copies it from a CSR into the certificate as it is (the
# statement is signed by the party's old key and checked by every verifier: the CA vouches for nothing in it)
ROTATION_OID = x509.ObjectIdentifier("2.25.154936142925447720865633133406074831733")
MAX_ROTATION_EXTENSION = 16384
ORG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,47}$")


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise ConfigError(f"party name {name!r}: use 1-32 lower-case letters, digits, '-' or '_', starting with a letter")
    return name


def write_new_file(path: str | Path, data: bytes, mode: int = 0o644, force: bool = False) -> Path:
    """Write `data` to a file that is created with permission `mode` from the first instant.

    Without `force` an existing file is an error (ConfigError naming it and ``--force``). With `force` the data goes
    to a fresh temporary file (same mode, same folder) that atomically replaces the old one, so a private key is
    never briefly world-readable and a crash never leaves half a key.

    Args:
        path: destination.
        data: the bytes.
        mode: permission bits given to ``os.open`` (0o600 for private keys); never widened later.
        force: replace an existing file.
    Returns:
        The path written.
    """
    path = Path(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    if path.exists() or path.is_symlink():
        if not force:
            raise ConfigError(f"{path} exists; refusing to overwrite it (pass --force to replace it)")
        target = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    else:
        target = path
    fd = os.open(target, flags, mode)  # O_EXCL: fails rather than follows or reuses anything already there
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if target != path:
            os.replace(target, path)
    except BaseException:
        if target.exists():
            target.unlink()
        raise
    return path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _pem(obj: x509.Certificate | x509.CertificateSigningRequest) -> bytes:
    return obj.public_bytes(serialization.Encoding.PEM)


def _san(name: str, hosts: list[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for h in [name, "localhost", "127.0.0.1", *hosts]:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            entries.append(x509.DNSName(h))
    return x509.SubjectAlternativeName(list(dict.fromkeys(entries)))


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)  # tolerate small clock skew between hosts


_LEAF_USAGE = x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False, content_commitment=False,
                            key_encipherment=False, data_encipherment=False, key_agreement=False,
                            encipher_only=False, decipher_only=False)
_CA_USAGE = x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                          key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
                          decipher_only=False)


def _party_cert(name: str, public_key, issuer: x509.Name, issuer_key, hosts: list[str], days: int,
                issuer_public_key=None, extensions: list[x509.ExtensionType] | None = None) -> x509.Certificate:
    now = _now()
    b = (x509.CertificateBuilder()
         .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
         .issuer_name(issuer).public_key(public_key)
         .serial_number(x509.random_serial_number())
         .not_valid_before(now).not_valid_after(now + dt.timedelta(days=days))
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
         .add_extension(_LEAF_USAGE, critical=True)
         .add_extension(_san(name, hosts), critical=False)
         .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                        critical=False)
         .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False))
    if issuer_public_key is not None:
        b = b.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_public_key), critical=False)
    for ext in extensions or []:  # e.g. a rotation statement (governance.trust.rotation), never critical
        b = b.add_extension(ext, critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def unique_ca_name(org: str) -> str:
    """``"<org> modelward CA <8 random hex>"``: two CAs never share a subject, so one trust bundle can hold both."""
    if not ORG_RE.match(org):
        raise ConfigError(f"CA name {org!r}: use 1-48 letters, digits, space, '.', '_' or '-'")
    return f"{org} modelward CA {secrets.token_hex(4)}"


def _new_ca(org: str, days: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, unique_ca_name(org)),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, org)])
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_CA_USAGE, critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return key, cert


def keygen(name: str, out: str | Path, hosts: list[str] | None = None, days: int = 365,
           force: bool = False) -> dict[str, Path]:
    """Make one party's own key on its own host: ``NAME.key`` (0600), self-signed ``NAME.pem``, ``NAME.csr``.

    Args:
        name: the party name (common name and DNS SAN).
        out: folder (created if needed).
        hosts: extra host names / IPs for the SAN (the host the party serves on, for two-host setups).
        days: validity of the self-signed certificate.
        force: replace existing files (a new key: peers must re-pin).
    Returns:
        ``{"key", "cert", "csr"}`` paths.
    Example:
        >>> keygen("alice", "alice-tls")  # doctest: +SKIP
        {'key': PosixPath('alice-tls/alice.key'), 'cert': ..., 'csr': ...}
    """
    check_name(name)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"key": out / f"{name}.key", "cert": out / f"{name}.pem", "csr": out / f"{name}.csr"}
    if not force:
        for p in paths.values():
            if p.exists():
                raise ConfigError(f"{p} exists; refusing to overwrite {name}'s key or certificate (pass --force "
                                  "to make a new key; peers must then re-pin its fingerprint)")
    hosts = list(hosts or [])
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = _party_cert(name, key.public_key(), subject, key, hosts, days)
    csr = (x509.CertificateSigningRequestBuilder().subject_name(subject)
           .add_extension(_san(name, hosts), critical=False).sign(key, hashes.SHA256()))
    write_new_file(paths["key"], _key_pem(key), 0o600, force)  # key first: nothing public exists without it
    write_new_file(paths["cert"], _pem(cert), 0o644, force)
    write_new_file(paths["csr"], _pem(csr), 0o644, force)
    return paths


def ca_init(out: str | Path, org: str, days: int = 1825, force: bool = False) -> dict[str, Path]:
    """Create a consortium CA in `out`: ``ca.key`` (0600) and ``ca.pem`` with a unique subject name.

    Args:
        out: folder (created if needed).
        org: organisation name; the CA's common name is ``"<org> modelward CA <random>"``.
        days: validity.
        force: replace an existing CA (every certificate it signed stops chaining to the new one).
    Returns:
        ``{"key", "cert"}`` paths.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"key": out / "ca.key", "cert": out / "ca.pem"}
    if not force:
        for p in paths.values():
            if p.exists():
                raise ConfigError(f"{p} exists; refusing to replace the CA (pass --force; certificates it signed "
                                  "would no longer verify)")
    key, cert = _new_ca(org, days)
    write_new_file(paths["key"], _key_pem(key), 0o600, force)
    write_new_file(paths["cert"], _pem(cert), 0o644, force)
    return paths


def _load_ca(ca_dir: str | Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    ca_dir = Path(ca_dir)
    cert = x509.load_pem_x509_certificate(read_pem(ca_dir / "ca.pem", "CA certificate"))
    key = serialization.load_pem_private_key(read_pem(ca_dir / "ca.key", "CA key"), password=None)
    if key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) \
            != cert.public_key().public_bytes(serialization.Encoding.DER,
                                              serialization.PublicFormat.SubjectPublicKeyInfo):
        raise ConfigError(f"{ca_dir}: ca.key does not belong to ca.pem")
    return key, cert  # type: ignore[return-value]


def ca_sign(ca_dir: str | Path, csr_path: str | Path, out: str | Path | None = None, days: int = 365,
            force: bool = False) -> Path:
    """Sign a party's CSR with the CA in `ca_dir`; write ``NAME-signed.pem`` (next to the CSR unless `out`).

    Only the CSR's common name (a valid party name), its SAN host names and a key-rotation statement
    (:data:`ROTATION_OID`, ``party rotate --csr``) are taken; the certificate is always a leaf (no CA bit) for
    server and client authentication, whatever extensions the CSR asks for.

    Args:
        ca_dir: folder with ``ca.pem`` and ``ca.key`` (from :func:`ca_init`).
        csr_path: the party's ``NAME.csr`` (from :func:`keygen`).
        out: output certificate path (default: ``NAME-signed.pem`` in the CSR's folder).
        days: validity.
        force: replace an existing certificate file.
    Returns:
        The certificate's path.
    """
    ca_key, ca_cert = _load_ca(ca_dir)
    data = read_pem(csr_path, "certificate signing request")
    try:
        csr = x509.load_pem_x509_csr(data)
    except ValueError as e:
        raise ConfigError(f"{csr_path}: not a certificate signing request: {e}") from e
    if not csr.is_signature_valid:
        raise ConfigError(f"{csr_path}: the request's signature does not verify (corrupted or forged CSR)")
    cns = csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(cns) != 1:
        raise ConfigError(f"{csr_path}: the request must have exactly one common name (the party name)")
    name = check_name(str(cns[0].value))
    hosts: list[str] = []
    try:
        san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        hosts = [*san.get_values_for_type(x509.DNSName), *(str(i) for i in san.get_values_for_type(x509.IPAddress))]
    except x509.ExtensionNotFound:
        pass
    extra: list[x509.ExtensionType] = []
    try:
        statement = csr.extensions.get_extension_for_oid(ROTATION_OID).value.value
        if len(statement) > MAX_ROTATION_EXTENSION:
            raise ConfigError(f"{csr_path}: the rotation statement in the request is {len(statement)} bytes (at "
                              f"most {MAX_ROTATION_EXTENSION})")
        extra.append(x509.UnrecognizedExtension(ROTATION_OID, statement))
    except x509.ExtensionNotFound:
        pass
    cert = _party_cert(name, csr.public_key(), ca_cert.subject, ca_key, hosts, days, ca_cert.public_key(),
                       extensions=extra)
    dest = Path(out) if out is not None else Path(csr_path).with_name(f"{name}-signed.pem")  # not NAME.pem: keygen's
    return write_new_file(dest, _pem(cert), 0o644, force)


def make_certs(out: str | Path, parties: list[str], hosts: list[str] | None = None, days: int = 365,
               ca_name: str = "demo", if_exists: Literal["error", "reuse", "overwrite"] = "error"
               ) -> dict[str, Path]:
    """Demo helper: a fresh CA (unique name) plus ``<party>.pem``/``<party>.key`` for each party in `out`.

    All keys are made in this one process: use it for a one-machine quick start only; organisations use
    :func:`keygen` and :func:`ca_sign` on their own hosts.

    Args:
        out: folder.
        parties: party names.
        hosts: extra SAN host names / IPs.
        days: validity.
        ca_name: organisation part of the CA's name (a random suffix makes it unique).
        if_exists: what to do when ``ca.pem``/``ca.key`` or a party's files exist: ``"error"`` (default, the CLI
            without ``--force``), ``"reuse"`` (keep the complete existing set, e.g. a resumed demo) or
            ``"overwrite"`` (``--force``).
    Returns:
        ``{"ca": ca.pem, party: party.pem ...}``.

    Example:
        >>> import tempfile
        >>> sorted(make_certs(tempfile.mkdtemp(), ["alice", "bob"]))
        ['alice', 'bob', 'ca']
    """
    out = Path(out)
    if not parties:
        raise ConfigError("--parties: give at least one party name, e.g. alice,bob")
    for p in parties:
        check_name(p)
    if len(set(parties)) != len(parties):
        raise ConfigError(f"--parties: names must be distinct, got {parties}")
    if if_exists not in ("error", "reuse", "overwrite"):
        raise ConfigError(f"if_exists={if_exists!r}: valid choices are 'error', 'reuse', 'overwrite'")
    files = [out / "ca.pem", out / "ca.key"] + [out / f"{p}.{s}" for p in parties for s in ("pem", "key")]
    paths = {"ca": out / "ca.pem", **{p: out / f"{p}.pem" for p in parties}}
    existing = [f for f in files if f.exists()]
    if existing and if_exists == "reuse" and len(existing) == len(files):
        return paths
    if existing and if_exists != "overwrite":
        raise ConfigError(f"{existing[0]} exists; refusing to replace the CA or a party's key (pass --force to "
                          "make a new set, or use another --out)")
    out.mkdir(parents=True, exist_ok=True)
    force = if_exists == "overwrite"
    ca_key, ca_cert = _new_ca(ca_name, days)
    write_new_file(out / "ca.key", _key_pem(ca_key), 0o600, force)
    write_new_file(out / "ca.pem", _pem(ca_cert), 0o644, force)
    for p in parties:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _party_cert(p, key.public_key(), ca_cert.subject, ca_key, list(hosts or []), days,
                           ca_cert.public_key())
        write_new_file(out / f"{p}.key", _key_pem(key), 0o600, force)
        write_new_file(out / f"{p}.pem", _pem(cert), 0o644, force)
    return paths


def read_pem(path: str | Path, what: str) -> bytes:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: {what} not found (make certificates with `modelward party keygen` or "
                          "`modelward party certs`)")
    data = p.read_bytes()
    if b"-----BEGIN" not in data:
        raise ConfigError(f"{p}: {what} is not a PEM file")
    return data
