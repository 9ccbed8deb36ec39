"""Pinned peer identities: a party is who its certificate's fingerprint says, not what its common name says.

Naming a party by the certificate's common name trusts every CA in the bundle to name parties honestly: with two
organisations' CAs in one bundle, Bob's CA can issue a certificate called ``alice``. Instead each party pins its
peers in its own configuration by the SHA-256 fingerprint of their certificate (the DER encoding, as
``openssl x509 -noout -fingerprint -sha256`` prints it) or of their public key (the DER SubjectPublicKeyInfo, which
survives re-issuing the certificate for the same key). A TLS handshake still has to succeed (chain to a trusted CA
or, with cross-pinning, to the pinned self-signed certificate itself); *who* the peer is then follows only from the
pin that matches.

Fingerprint formats (what ``modelward party fingerprint CERT`` prints):

- ``sha256:<64 hex>`` - the certificate;
- ``spki-sha256:<64 hex>`` - the public key (SubjectPublicKeyInfo).

Pins are compared after normalisation (lower case; ``AB:CD:..`` colon-separated hex accepted).

Example:
    >>> pins = {"alice": cert_fingerprint(alice_pem), "bob": public_key_fingerprint(bob_pem)}  # doctest: +SKIP
    >>> identify_peer(peer_pem_from_auth_context(context.auth_context()), pins)  # doctest: +SKIP
    'alice'
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from modelward.errors import ConfigError, IdentityError

CERT_PREFIX = "sha256:"
SPKI_PREFIX = "spki-sha256:"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _load_cert(cert_pem: bytes, what: str = "certificate") -> x509.Certificate:
    if isinstance(cert_pem, str):
        cert_pem = cert_pem.encode()
    if not cert_pem:
        raise IdentityError(f"no {what} presented (the peer sent no client certificate)")
    try:
        if b"-----BEGIN" in cert_pem:
            return x509.load_pem_x509_certificate(cert_pem)
        return x509.load_der_x509_certificate(cert_pem)
    except ValueError as e:
        raise IdentityError(f"{what} is not a valid X.509 certificate (PEM or DER): {e}") from e


def cert_fingerprint(cert_pem: bytes) -> str:
    """The pin of a certificate: ``"sha256:" + hex(SHA-256(DER))``.

    Args:
        cert_pem: the certificate, PEM (or DER) bytes.
    Returns:
        ``sha256:<64 lower-case hex>``, equal to ``openssl x509 -fingerprint -sha256`` without the colons.
    Example:
        >>> cert_fingerprint(Path("alice.pem").read_bytes())  # doctest: +SKIP
        'sha256:3f0c...'
    """
    der = _load_cert(cert_pem).public_bytes(serialization.Encoding.DER)
    return CERT_PREFIX + hashlib.sha256(der).hexdigest()


def public_key_fingerprint(pem: bytes) -> str:
    """The pin of a public key: ``"spki-sha256:" + hex(SHA-256(DER SubjectPublicKeyInfo))``.

    Args:
        pem: a certificate, a CSR, a public key or a private key (PEM); the public key is taken from it.
    Returns:
        ``spki-sha256:<64 lower-case hex>`` (the same value for every certificate issued for that key).
    """
    if isinstance(pem, str):
        pem = pem.encode()
    pub = None
    if b"CERTIFICATE REQUEST" in pem:
        pub = x509.load_pem_x509_csr(pem).public_key()
    elif b"CERTIFICATE" in pem or b"-----BEGIN" not in pem:
        pub = _load_cert(pem).public_key()
    elif b"PRIVATE KEY" in pem:
        pub = serialization.load_pem_private_key(pem, password=None).public_key()
    else:
        try:
            pub = serialization.load_pem_public_key(pem)
        except ValueError as e:
            raise IdentityError(f"not a certificate, CSR or key: {e}") from e
    der = pub.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return SPKI_PREFIX + hashlib.sha256(der).hexdigest()


def normalize_fingerprint(value: str, where: str = "pin") -> str:
    """Canonical form of a pin; ConfigError naming `where` and the accepted formats if it is malformed."""
    v = str(value).strip().lower()
    for prefix in (SPKI_PREFIX, CERT_PREFIX):
        if v.startswith(prefix):
            hexpart = v[len(prefix):].replace(":", "")
            if _HEX64.match(hexpart):
                return prefix + hexpart
    raise ConfigError(f"{where}: {value!r} is not a fingerprint; use 'sha256:<64 hex>' (certificate) or "
                      "'spki-sha256:<64 hex>' (public key), as printed by `modelward party fingerprint CERT`")


def normalize_pins(pins: Mapping[str, str], where: str = "pins") -> dict[str, str]:
    """Validate a ``{party: fingerprint}`` table: well-formed fingerprints, no fingerprint pinned twice."""
    out: dict[str, str] = {}
    seen: dict[str, str] = {}
    for name, fp in pins.items():
        norm = normalize_fingerprint(fp, f"{where}.{name}")
        if norm in seen:
            raise ConfigError(f"{where}: {name!r} and {seen[norm]!r} pin the same fingerprint {norm}; each party "
                              "must have its own key")
        seen[norm] = name
        out[name] = norm
    return out


def identify_peer(peer_cert_pem: bytes, pins: Mapping[str, str]) -> str:
    """The pinned party name whose fingerprint matches the presented certificate (or its public key).

    The certificate's common name and SANs play no part: a certificate named ``alice`` by any CA is ``alice``
    only if its fingerprint is the one pinned for ``alice``.

    Args:
        peer_cert_pem: the leaf certificate the peer presented in the TLS handshake (PEM or DER).
        pins: ``{party name: "sha256:..." | "spki-sha256:..."}`` from this party's configuration.
    Returns:
        The matching party name.
    Raises:
        IdentityError: nothing matches (the message names the presented fingerprints and common name).
        ConfigError: a pin is malformed or two parties pin the same fingerprint.
    Example:
        >>> identify_peer(bob_pem, {"bob": cert_fingerprint(bob_pem)})  # doctest: +SKIP
        'bob'
    """
    norm = normalize_pins(pins)
    cert = _load_cert(peer_cert_pem, "peer certificate")
    der = cert.public_bytes(serialization.Encoding.DER)
    cert_fp = CERT_PREFIX + hashlib.sha256(der).hexdigest()
    spki = cert.public_key().public_bytes(serialization.Encoding.DER,
                                          serialization.PublicFormat.SubjectPublicKeyInfo)
    key_fp = SPKI_PREFIX + hashlib.sha256(spki).hexdigest()
    # constant-time compare: the pins are not secret, but there is no reason to leak timing either
    matches = [name for name, fp in norm.items()
               if hmac.compare_digest(fp, cert_fp) or hmac.compare_digest(fp, key_fp)]
    if len(matches) > 1:
        raise ConfigError(f"pins: {matches} all match certificate {cert_fp} (one by certificate, one by key); "
                          "each party must have its own key")
    if not matches:
        try:
            cn = ", ".join(str(a.value) for a in cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME))
        except Exception:  # noqa: BLE001 - the name is only for the message
            cn = "?"
        raise IdentityError(f"peer certificate {cert_fp} (key {key_fp}, common name {cn!r}) is not pinned; "
                            f"pinned parties: {sorted(norm) or 'none'}")
    return matches[0]


def peer_pem_from_auth_context(auth_context: Mapping[str, list[bytes]]) -> bytes:
    """The peer's leaf certificate (PEM) from a gRPC ``ServicerContext.auth_context()``; b"" if none was sent."""
    vals = auth_context.get("x509_pem_cert") or []
    return vals[0] if vals else b""
