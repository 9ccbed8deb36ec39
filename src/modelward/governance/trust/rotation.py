"""Certificate rotation: a party replaces its key mid-training and its peers follow without an out-of-band re-pin.

The trust step is a **rotation statement**, signed by the party's *old* private key (the key its peers pin)::

    payload = {"format": "modelward-rotation/1", "party": NAME, "sequence": n, "issued_at": UTC time,
               "old_cert": base64(DER of the old certificate), "new_key": "spki-sha256:<new public key>"}
    signature = ECDSA-P256-SHA256(old key, canonical JSON of payload)

``modelward party rotate PARTY.toml`` makes a new key, writes the statement *into the new certificate* (a
non-critical X.509 extension, :data:`ROTATION_OID`) and also as a file. A verifier that meets an unpinned
certificate (a party server in the TLS handshake of a client, a client in the handshake with a server) accepts
it as party NAME only if (:func:`verify_statement`):

1. the statement's ``old_cert`` is the certificate (or key) the verifier pins for NAME *now*;
2. the signature verifies under that old certificate's public key (only the holder of the old key can sign);
3. ``new_key`` is the public key of the certificate presented (the TLS handshake proves possession of it);
4. ``sequence`` is greater than every sequence it accepted from NAME before (a replayed statement is refused),
   and ``issued_at`` is not in the future (5 minutes of clock skew tolerated);
5. the new key is not on its deny-list and not pinned for another party.

The verifier then pins the new certificate for NAME (persisted in ``rotations.json`` next to its checkpoints, so a
restart keeps it) and keeps the old pin valid for ``rotation_overlap_s`` (requests already in flight on a
connection made before the switch), after which the old pin is **retired**: it leaves the pins *and* goes on the
deny-list (:mod:`~modelward.governance.trust.revocation`). Deny-listing, not only removal, because the old key
may be the reason for the rotation (a leaked key): it must never be accepted again, neither under its old pin nor
through a later statement that rotates "back" to it, nor pinned afresh by mistake.

The statement never widens trust beyond the chain of keys the verifier already pinned: an attacker without the
pinned key cannot forge one, and the TLS layer still has to accept the new certificate (a consortium CA that
signs it, or, with cross-pinning, a statement picked up from the party's inbox before the switch, which adds the
new self-signed certificate to the trusted roots: :meth:`PeerTrust.pick_up`).

Example:
    >>> result = rotate_keys("alice", "certs/alice.key", "certs/alice.pem", ca_dir="ca/")  # doctest: +SKIP
    >>> trust = PeerTrust({"alice": old_pin}, RotationStore("rotations.json"), DenyList("revoked.txt"))  # doctest: +SKIP
    >>> trust.identify(new_cert_pem)  # doctest: +SKIP
    'alice'
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from modelward.core.records import atomic_write_text
from modelward.errors import ConfigError, IdentityError
from modelward.governance.trust.certs import (
    ROTATION_OID,
    _key_pem,
    _load_ca,
    _party_cert,
    _pem,
    _san,
    check_name,
    read_pem,
    write_new_file,
)
from modelward.governance.trust.identity import CERT_PREFIX, SPKI_PREFIX, normalize_fingerprint
from modelward.governance.trust.revocation import DenyList, revoke

FORMAT = "modelward-rotation/1"
CLOCK_SKEW_S = 300.0
MAX_STATEMENT_BYTES = 16384


class RotationError(IdentityError):
    """A rotation statement is refused; the message says which check failed."""


def fingerprints(pem: bytes) -> tuple[str, str]:
    """``(sha256:<cert>, spki-sha256:<key>)`` of a certificate (PEM or DER)."""
    cert = _cert(pem)
    der = cert.public_bytes(serialization.Encoding.DER)
    spki = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return CERT_PREFIX + hashlib.sha256(der).hexdigest(), SPKI_PREFIX + hashlib.sha256(spki).hexdigest()


def _cert(pem: bytes | str) -> x509.Certificate:
    if isinstance(pem, str):
        pem = pem.encode()
    if not pem:
        raise IdentityError("no certificate presented")
    try:
        return (x509.load_pem_x509_certificate(pem) if b"-----BEGIN" in pem else x509.load_der_x509_certificate(pem))
    except ValueError as e:
        raise IdentityError(f"not a valid X.509 certificate: {e}") from e


def _canonical(obj: Mapping[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _utc(t: float | None = None) -> str:
    return dt.datetime.fromtimestamp(time.time() if t is None else t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class RotationStatement:
    """A party's signed announcement that its key `old_cert` is replaced by the key `new_key` (see the module
    docstring for the payload and the checks).

    Args:
        party: the rotating party's name.
        sequence: 1 for the first rotation of a key chain, then +1 each time.
        issued_at: UTC time, ``YYYY-MM-DDTHH:MM:SSZ``.
        old_cert: DER of the certificate its peers pin now.
        new_key: ``spki-sha256:`` fingerprint of the new public key.
        signature: ECDSA-SHA256 by the old key over :meth:`payload`.
    """

    party: str
    sequence: int
    issued_at: str
    old_cert: bytes
    new_key: str
    signature: bytes = b""

    def payload(self) -> bytes:
        """The signed bytes: the canonical JSON (sorted keys, no spaces) of every field but the signature."""
        return _canonical({"format": FORMAT, "party": self.party, "sequence": self.sequence,
                           "issued_at": self.issued_at, "old_cert": base64.b64encode(self.old_cert).decode(),
                           "new_key": self.new_key})

    def to_bytes(self) -> bytes:
        """JSON (the payload's fields and ``signature`` in base64): the extension's value and the file's bytes."""
        d = json.loads(self.payload())
        d["signature"] = base64.b64encode(self.signature).decode()
        return _canonical(d)

    @classmethod
    def from_bytes(cls, data: bytes) -> RotationStatement:
        """Parse (no verification); RotationError names what is malformed."""
        if len(data) > MAX_STATEMENT_BYTES:
            raise RotationError(f"rotation statement of {len(data)} bytes (at most {MAX_STATEMENT_BYTES})")
        try:
            d = json.loads(data)
            if not isinstance(d, dict) or d.get("format") != FORMAT:
                raise ValueError(f"format is not {FORMAT!r}")
            unknown = set(d) - {"format", "party", "sequence", "issued_at", "old_cert", "new_key", "signature"}
            if unknown:
                raise ValueError(f"unknown fields {sorted(unknown)}")
            seq = d["sequence"]
            if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
                raise ValueError(f"sequence {seq!r} is not a positive integer")
            return cls(party=str(d["party"]), sequence=seq, issued_at=str(d["issued_at"]),
                       old_cert=base64.b64decode(d["old_cert"], validate=True), new_key=str(d["new_key"]),
                       signature=base64.b64decode(d["signature"], validate=True))
        except (ValueError, KeyError, TypeError) as e:
            raise RotationError(f"malformed rotation statement: {e}") from None

    @property
    def old_fingerprints(self) -> tuple[str, str]:
        """``(sha256:…, spki-sha256:…)`` of the old certificate."""
        return fingerprints(self.old_cert)


def sign_statement(party: str, sequence: int, old_cert_pem: bytes, old_key: ec.EllipticCurvePrivateKey,
                   new_public_key: ec.EllipticCurvePublicKey, issued_at: str | None = None) -> RotationStatement:
    """Make and sign a rotation statement with the old key.

    Args:
        party: the party's name; sequence: its rotation number (previous + 1).
        old_cert_pem: the certificate peers pin now; old_key: its private key (it signs).
        new_public_key: the new key's public half; issued_at: default now (UTC).

    Returns:
        The signed :class:`RotationStatement`.

    Example:
        >>> st = sign_statement("alice", 1, old_pem, old_key, new_key.public_key())  # doctest: +SKIP
    """
    old = _cert(old_cert_pem)
    if old.public_key().public_numbers() != old_key.public_key().public_numbers():
        raise ConfigError("the old key does not belong to the old certificate (tls.key / tls.cert mismatch)")
    spki = new_public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    st = RotationStatement(check_name(party), int(sequence), issued_at or _utc(),
                           old.public_bytes(serialization.Encoding.DER),
                           SPKI_PREFIX + hashlib.sha256(spki).hexdigest())
    sig = old_key.sign(st.payload(), ec.ECDSA(hashes.SHA256()))
    return RotationStatement(st.party, st.sequence, st.issued_at, st.old_cert, st.new_key, sig)


def statement_from_cert(pem: bytes) -> RotationStatement | None:
    """The rotation statement a certificate carries (:data:`ROTATION_OID`), or None."""
    try:
        ext = _cert(pem).extensions.get_extension_for_oid(ROTATION_OID)
    except x509.ExtensionNotFound:
        return None
    return RotationStatement.from_bytes(ext.value.value)


def verify_statement(st: RotationStatement, new_cert_pem: bytes, pinned: str, last_sequence: int = 0,
                     now: float | None = None) -> str:
    """Check a rotation statement for the certificate `new_cert_pem` against the verifier's current pin.

    Args:
        st: the statement (from the certificate or from a file).
        new_cert_pem: the certificate that takes over (presented in the handshake, or shipped with the file).
        pinned: the verifier's current pin for ``st.party`` (``sha256:`` or ``spki-sha256:``).
        last_sequence: the highest sequence the verifier accepted from that party (0: none).
        now: the time (default ``time.time()``).

    Returns:
        The new certificate's ``sha256:`` fingerprint (the new pin).

    Raises:
        RotationError: naming the failed check (module docstring, checks 1-4).
    """
    pinned = normalize_fingerprint(pinned, f"pin of {st.party}")
    old_fp, old_key_fp = st.old_fingerprints
    if pinned not in (old_fp, old_key_fp):
        raise RotationError(f"rotation statement #{st.sequence} of {st.party!r} replaces {old_fp}, which is not the "
                            f"certificate pinned for {st.party!r} ({pinned}): an old or foreign statement")
    old_pub = _cert(st.old_cert).public_key()
    if not isinstance(old_pub, ec.EllipticCurvePublicKey):
        raise RotationError(f"rotation statement of {st.party!r}: the old key is not an ECDSA key")
    try:
        old_pub.verify(st.signature, st.payload(), ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise RotationError(f"rotation statement #{st.sequence} of {st.party!r}: the signature does not verify "
                            f"under the pinned key {old_key_fp} (not signed by {st.party}'s old key, or altered)") \
            from None
    new_fp, new_key_fp = fingerprints(new_cert_pem)
    if normalize_fingerprint(st.new_key, "new_key") != new_key_fp:
        raise RotationError(f"rotation statement of {st.party!r} names the key {st.new_key}, but the certificate "
                            f"presented has {new_key_fp}")
    if new_key_fp == old_key_fp:
        raise RotationError(f"rotation statement of {st.party!r} keeps the same key {new_key_fp}")
    if st.sequence <= last_sequence:
        raise RotationError(f"rotation statement #{st.sequence} of {st.party!r} is a replay: #{last_sequence} was "
                            "accepted already")
    try:
        issued = dt.datetime.strptime(st.issued_at, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()
    except ValueError:
        raise RotationError(f"rotation statement of {st.party!r}: issued_at {st.issued_at!r} is not "
                            "YYYY-MM-DDTHH:MM:SSZ") from None
    if issued > (time.time() if now is None else now) + CLOCK_SKEW_S:
        raise RotationError(f"rotation statement of {st.party!r} is issued in the future ({st.issued_at})")
    return new_fp


# ---------------------------------------------------------------------------------------------- the rotating side
@dataclass
class RotationResult:
    """What :func:`rotate_keys` wrote (with ``csr``: the staged key and the request; no certificate or pin yet)."""

    statement: RotationStatement
    statement_path: Path | None
    key: Path
    cert: Path | None
    old_pin: str
    new_pin: str | None
    csr: Path | None = None


def staged(path: str | Path) -> Path:
    """Where a staged (not yet switched) key or certificate waits: ``<path>.next``."""
    return Path(str(path) + ".next")


def switch_staged(key_path: str | Path, cert_path: str | Path) -> None:
    """Put a staged pair (:func:`rotate_keys` with ``stage=True``) in place: certificate first, then key (a running
    party switches when both match). ConfigError if nothing is staged."""
    k, c = staged(key_path), staged(cert_path)
    if not (k.is_file() and c.is_file()):
        raise ConfigError(f"nothing staged: {c} / {k} not found (run `party rotate --stage` first)")
    os.replace(c, cert_path)
    os.replace(k, key_path)


def install_signed(key_path: str | Path, cert_path: str | Path, signed: str | Path) -> str:
    """After ``party rotate --csr`` and ``party ca sign`` at the CA: check that the signed certificate is for the
    staged key and carries a statement the current certificate's pin accepts, then put both in place (certificate
    first, then key). Returns the new pin.

    Args:
        key_path / cert_path: the party's ``tls.key`` / ``tls.cert``; signed: the certificate the CA returned.

    Returns:
        The new certificate's ``sha256:`` pin.
    """
    k = staged(key_path)
    if not k.is_file():
        raise ConfigError(f"nothing staged: {k} not found (run `party rotate --csr` first)")
    new_pem = read_pem(signed, "signed certificate")
    key_pem = k.read_bytes()
    fmt = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    staged_pub = serialization.load_pem_private_key(key_pem, password=None).public_key().public_bytes(*fmt)
    if _cert(new_pem).public_key().public_bytes(*fmt) != staged_pub:
        raise ConfigError(f"{signed} is not a certificate for the staged key {k}")
    st = statement_from_cert(new_pem)
    if st is None:
        raise ConfigError(f"{signed} carries no rotation statement (was it signed by `party ca sign` from the "
                          "CSR `party rotate --csr` wrote?)")
    pin = verify_statement(st, new_pem, fingerprints(read_pem(cert_path, "tls.cert"))[0])
    write_new_file(cert_path, _pem(_cert(new_pem)), 0o644, force=True)
    os.replace(k, key_path)
    return pin


def rotate_keys(name: str, key_path: str | Path, cert_path: str | Path, ca_dir: str | Path | None = None,
                days: int = 365, statement_dir: str | Path | None = None, stage: bool = False,
                csr: bool = False) -> RotationResult:
    """Replace a party's key and certificate in place, announcing the new key with a statement signed by the old.

    The new certificate keeps the old one's host names, carries the statement (:data:`ROTATION_OID`) and is
    signed by the consortium CA in `ca_dir` (its ``ca.key``: run where the CA is) or, without one, by the new
    key itself (cross-pinning: peers then pick the statement file up, :meth:`PeerTrust.pick_up`, before the
    party switches). The certificate is written first, then the key, each atomically; a running party switches
    when both files form a pair again (:mod:`modelward.governance.transport.credentials`).

    Args:
        name: the party's name; key_path / cert_path: its ``tls.key`` / ``tls.cert``.
        ca_dir: the CA folder (``party ca init``) when the party's certificates are CA-signed.
        days: validity of the new certificate; statement_dir: where ``NAME-rotation-<n>.json`` goes (default the
            certificate's folder).
        stage: write the new pair to ``<key>.next`` / ``<cert>.next`` and switch later (:func:`switch_staged`):
            with cross-pinning, once every peer has picked the statement up.
        csr: a CA whose key is elsewhere: stage the new key and write ``NAME-rotation-<n>.csr`` carrying the
            statement; ``party ca sign`` copies it into the certificate, :func:`install_signed` puts it in place.

    Returns:
        A :class:`RotationResult` (statement, paths, the old and the new pin).

    Example:
        >>> rotate_keys("alice", "certs/alice.key", "certs/alice.pem", ca_dir="certs")  # doctest: +SKIP
    """
    check_name(name)
    key_path, cert_path = Path(key_path), Path(cert_path)
    old_pem = read_pem(cert_path, "tls.cert")
    try:
        old_key = serialization.load_pem_private_key(read_pem(key_path, "tls.key"), password=None)
    except ValueError as e:
        raise ConfigError(f"tls.key {key_path}: not a private key: {e}") from None
    if not isinstance(old_key, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"tls.key {key_path}: rotation signs with ECDSA keys (made by `party keygen`)")
    old = _cert(old_pem)
    previous = statement_from_cert(old_pem)
    sequence = (previous.sequence if previous is not None else 0) + 1
    new_key = ec.generate_private_key(ec.SECP256R1())
    st = sign_statement(name, sequence, old_pem, old_key, new_key.public_key())
    try:
        san = old.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        hosts = [*san.get_values_for_type(x509.DNSName), *(str(i) for i in san.get_values_for_type(x509.IPAddress))]
    except x509.ExtensionNotFound:
        hosts = []
    ext = x509.UnrecognizedExtension(ROTATION_OID, st.to_bytes())
    out = Path(statement_dir) if statement_dir is not None else cert_path.parent
    if csr:
        request = (x509.CertificateSigningRequestBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                   .add_extension(_san(name, hosts), critical=False).add_extension(ext, critical=False)
                   .sign(new_key, hashes.SHA256()))
        out.mkdir(parents=True, exist_ok=True)
        csr_path = write_new_file(out / f"{name}-rotation-{sequence}.csr", _pem(request), 0o644, force=True)
        write_new_file(staged(key_path), _key_pem(new_key), 0o600, force=True)
        return RotationResult(st, None, staged(key_path), None, fingerprints(old_pem)[0], None, csr_path)
    if ca_dir is not None:
        ca_key, ca_cert = _load_ca(ca_dir)
        cert = _party_cert(name, new_key.public_key(), ca_cert.subject, ca_key, hosts, days, ca_cert.public_key(),
                           extensions=[ext])
    else:
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = _party_cert(name, new_key.public_key(), subject, new_key, hosts, days, extensions=[ext])
    out.mkdir(parents=True, exist_ok=True)
    st_path = out / f"{name}-rotation-{sequence}.json"
    doc = {"statement": json.loads(st.to_bytes()), "new_cert": _pem(cert).decode()}
    write_new_file(st_path, (json.dumps(doc, indent=1) + "\n").encode(), 0o644, force=True)
    # certificate first, then key: until both are written the pair does not match and a running party keeps the
    # old one (it never loads half a rotation)
    dest_cert, dest_key = (staged(cert_path), staged(key_path)) if stage else (cert_path, key_path)
    write_new_file(dest_cert, _pem(cert), 0o644, force=True)
    write_new_file(dest_key, _key_pem(new_key), 0o600, force=True)
    return RotationResult(st, st_path, dest_key, dest_cert, fingerprints(old_pem)[0], fingerprints(_pem(cert))[0])


def read_statement_file(path: str | Path) -> tuple[RotationStatement, bytes]:
    """``(statement, new certificate PEM)`` from a ``NAME-rotation-<n>.json`` file (not verified)."""
    p = Path(path)
    try:
        doc = json.loads(p.read_bytes()[:4 * MAX_STATEMENT_BYTES])
        return RotationStatement.from_bytes(_canonical(doc["statement"])), str(doc["new_cert"]).encode()
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RotationError(f"{p}: not a rotation statement file ({e})") from None


# ---------------------------------------------------------------------------------------------- the verifying side
class RotationStore:
    """The rotations a verifier accepted, per party: its current pin and certificate, the last sequence, the pins
    it replaced, and the old pin still in its overlap. A JSON file written atomically (absent: none).

    Args:
        path: the file (a party's ``<checkpoint_dir>/rotations.json``; None: kept in memory only).
    """

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path is not None else None
        self.entries: dict[str, dict[str, Any]] = {}
        if self.path is not None and self.path.is_file():
            try:
                self.entries = json.loads(self.path.read_text())
            except ValueError as e:
                raise ConfigError(f"{self.path}: not a rotation store ({e}); move it away to start afresh") from None

    def sequence(self, party: str) -> int:
        return int(self.entries.get(party, {}).get("sequence", 0))

    def save(self) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.path, json.dumps(self.entries, indent=1, sort_keys=True) + "\n")


Event = Callable[[str, str, str], None]  # (party, decision "allow" | "deny", message)


class PeerTrust:
    """Who a presented certificate is: the pins, followed through accepted rotations, with the deny-list applied
    to the certificate presented (module docstring). Shared by a party's server (its clients' certificates) and
    its links (the next party's server certificate), and used by the driver's links.

    Args:
        pins: ``{party: fingerprint}``, normalised; updated in place as rotations are accepted.
        store: the accepted rotations (re-applied at start: a pin the store replaced follows to its newest one).
        deny: the deny-list (retired pins are added to it); None: none.
        overlap_s: how long an old pin stays valid after its successor is first seen.
        inbox: a folder whose ``*-rotation-*.json`` statement files are picked up (cross-pinning); None: none.
        on_event: ``on_event(party, decision, message)`` for each rotation accepted ("allow"), each pin retired
            ("allow") and each inbox statement refused ("deny"): the party records them in its audit log.

    Returns:
        ``identify(pem) -> party name``; ``roots()`` the extra trusted certificates (PEM) of followed rotations.
    """

    def __init__(self, pins: MutableMapping[str, str], store: RotationStore | None = None,
                 deny: DenyList | None = None, overlap_s: float = 30.0, inbox: str | Path | None = None,
                 on_event: Event | None = None) -> None:
        self.pins, self.store, self.deny = pins, store or RotationStore(None), deny
        self.overlap_s, self.on_event = overlap_s, on_event
        self.inbox = Path(inbox) if inbox is not None else None
        self._inbox_stamp: int | None = None
        self._inbox_looked = -1e18
        self.lock = threading.RLock()
        self.version = 0  # +1 whenever the pins or the extra roots change
        self._cache: dict[bytes, tuple[str, str]] = {}
        for party, e in self.store.entries.items():
            current = self.pins.get(party)
            if current is None:
                continue
            if current != e["pin"] and current in e.get("history", []):
                self.pins[party] = e["pin"]  # the configuration still names a key this party rotated away from

    # -- inputs
    def _event(self, party: str, message: str, decision: str = "allow") -> None:
        if self.on_event is not None:
            try:
                self.on_event(party, decision, message)
            except Exception:  # noqa: BLE001 - recording must not decide identity
                pass

    def roots(self) -> bytes:
        """PEM of the certificates followed by rotation (for a TLS trust bundle next to ``tls.ca``)."""
        with self.lock:
            return b"".join(e["cert"].encode() for e in self.store.entries.values() if e.get("cert"))

    def pick_up(self) -> list[str]:
        """Accept the statement files in the inbox that are new (each verified as in-band; a refused one is left
        in place and reported through ``on_event``). Returns the parties whose pin moved."""
        if self.inbox is None:
            return []
        try:
            stamp = os.stat(self.inbox).st_mtime_ns
        except FileNotFoundError:
            return []
        if stamp == self._inbox_stamp:
            return []
        moved: list[str] = []
        with self.lock:
            self._inbox_stamp = stamp
            for f in sorted(self.inbox.glob("*-rotation-*.json")):
                try:
                    st, cert = read_statement_file(f)
                    if self.store.sequence(st.party) >= st.sequence:
                        continue
                    self.accept(st, cert, in_use=False)
                    moved.append(st.party)
                except IdentityError as e:
                    self._event("(inbox)", f"rotation statement {f.name} refused: {e}", "deny")
        return moved

    # -- decisions
    def identify(self, pem: bytes) -> str:
        """The party a presented certificate belongs to (module docstring); IdentityError if none."""
        if self.inbox is not None and time.monotonic() - self._inbox_looked >= 0.25:
            self._inbox_looked = time.monotonic()  # (a request does not pay a stat; a handshake always looks)
            self.pick_up()
        with self.lock:
            self._retire_expired()
            hit = self._cache.get(pem)
            cert_fp, key_fp = hit if hit is not None else fingerprints(pem)
            if hit is None:
                if len(self._cache) > 256:
                    self._cache.clear()
                self._cache[pem] = (cert_fp, key_fp)
            for name, pin in self.pins.items():
                if pin in (cert_fp, key_fp):
                    # a current pin: whether it is revoked is the gate's check (refused per request, audited)
                    self._first_use(name)
                    return name
            if self.deny is not None:  # a retired or revoked key is never followed or let through an overlap
                for fp in (cert_fp, key_fp):
                    reason = self.deny.reason(fp)
                    if reason:
                        raise IdentityError(f"presented {reason}")
            for name, e in self.store.entries.items():
                prev = e.get("previous")
                if prev and prev in (cert_fp, key_fp) and self.pins.get(name) == e["pin"]:
                    return name  # the old key, within its overlap
            st = statement_from_cert(pem)
            if st is None:
                raise IdentityError(f"peer certificate {cert_fp} (key {key_fp}) is not pinned and carries no "
                                    f"rotation statement; pinned parties: {sorted(self.pins) or 'none'}")
            return self.accept(st, pem, in_use=True)

    def accept(self, st: RotationStatement, new_cert_pem: bytes, in_use: bool) -> str:
        """Verify `st` for `new_cert_pem` and follow it: the new pin replaces the old, which stays valid for the
        overlap (from now when the new certificate is in use, else from its first use). Returns the party."""
        with self.lock:
            if st.party not in self.pins:
                raise RotationError(f"rotation statement of {st.party!r}: not a pinned peer "
                                    f"(pinned: {sorted(self.pins)})")
            new_fp, new_key_fp = fingerprints(new_cert_pem)
            if self.deny is not None and (self.deny.reason(new_fp) or self.deny.reason(new_key_fp)):
                raise RotationError(f"rotation statement of {st.party!r} names a revoked key {new_key_fp}")
            others = [n for n, p in self.pins.items() if n != st.party and p in (new_fp, new_key_fp)]
            if others:
                raise RotationError(f"rotation statement of {st.party!r} names the key pinned for {others[0]!r}")
            old_pin = self.pins[st.party]
            revoked = self.deny.reason(old_pin) if self.deny is not None else None
            if revoked:  # whoever holds a revoked key must not buy a fresh one with it
                raise RotationError(f"rotation statement of {st.party!r} is signed by a revoked key: {revoked}; "
                                    "re-admitting a revoked party is a new pin in its configuration")
            verify_statement(st, new_cert_pem, old_pin, self.store.sequence(st.party))
            e = self.store.entries.get(st.party, {})
            if e.get("previous"):  # a second rotation before the first one's overlap ended
                self._retire(st.party, e)
            history = [*e.get("history", []), *dict.fromkeys([old_pin, *st.old_fingerprints])]
            self.store.entries[st.party] = {
                "pin": new_fp, "sequence": st.sequence, "cert": _pem(_cert(new_cert_pem)).decode(),
                "history": list(dict.fromkeys(history)), "previous": old_pin,
                "previous_key": st.old_fingerprints[1],
                "retire_at": time.time() + self.overlap_s if in_use else None, "accepted_at": _utc()}
            self.pins[st.party] = new_fp
            self.store.save()
            self.version += 1
            self._cache.clear()
        self._event(st.party, f"rotation #{st.sequence} accepted: {st.party} now pinned as {new_fp} (statement "
                              f"signed by its old key {old_pin}, issued {st.issued_at}); the old pin is retired "
                              f"{'after ' + format(self.overlap_s, 'g') + ' s' if in_use else 'once the new one is used'}")
        if in_use:
            self._retire_expired()
        return st.party

    def _first_use(self, name: str) -> None:
        e = self.store.entries.get(name)
        if e and e.get("previous") and e.get("retire_at") is None and self.pins.get(name) == e["pin"]:
            e["retire_at"] = time.time() + self.overlap_s
            self.store.save()
            self._retire_expired()

    def _retire_expired(self) -> None:
        now = time.time()
        for name, e in self.store.entries.items():
            if e.get("previous") and e.get("retire_at") is not None and now >= e["retire_at"]:
                self._retire(name, e)

    def _retire(self, name: str, e: dict[str, Any]) -> None:
        old = e["previous"]
        e["previous"], e["retire_at"] = None, None
        if self.deny is not None:  # the certificate and its key: a re-issued certificate for it is refused too
            for fp in dict.fromkeys([old, e.get("previous_key") or old]):
                revoke(self.deny.path, fp, f"{name}, retired by rotation #{e['sequence']}")
        self.store.save()
        self.version += 1
        self._cache.clear()
        self._event(name, f"old pin {old} of {name} retired after rotation #{e['sequence']} (deny-listed)")


def deliver_statement(statement_path: str | Path, pins: Mapping[str, str], state_dir: str | Path,
                      deny: DenyList | None = None) -> tuple[Path, str, int]:
    """`modelward party accept-rotation`: verify a peer's statement file against this party's pins (followed
    through the rotations it accepted already) and copy it into its inbox, where the running party picks it up
    (:meth:`PeerTrust.pick_up`, which verifies it again: this check only fails early, with the reason).

    Args:
        statement_path: the peer's ``NAME-rotation-<n>.json``.
        pins: this party's configured pins; state_dir: its ``checkpoint_dir`` (``rotations.json``, the inbox).
        deny: its deny-list.

    Returns:
        ``(the file in the inbox, the rotating party, the statement's sequence)``.

    Example:
        >>> deliver_statement("alice-rotation-1.json", pins(cfg), cfg.checkpoint_dir)  # doctest: +SKIP
        (PosixPath('.../rotations-inbox/alice-rotation-1.json'), 'alice', 1)
    """
    st, cert = read_statement_file(statement_path)
    # a read-only view: the running party is the only writer of its rotation store
    trust = PeerTrust(dict(pins), RotationStore(Path(state_dir) / "rotations.json"), deny)
    if st.party not in trust.pins:
        raise RotationError(f"rotation statement of {st.party!r}: not a pinned peer (pinned: {sorted(trust.pins)})")
    new_fp, new_key_fp = fingerprints(cert)
    if deny is not None and (deny.reason(new_fp) or deny.reason(new_key_fp)):
        raise RotationError(f"rotation statement of {st.party!r} names a revoked key {new_key_fp}")
    verify_statement(st, cert, trust.pins[st.party], trust.store.sequence(st.party))
    inbox = Path(state_dir) / "rotations-inbox"
    inbox.mkdir(parents=True, exist_ok=True)
    dest = inbox / f"{st.party}-rotation-{st.sequence}.json"
    write_new_file(dest, Path(statement_path).read_bytes(), 0o644, force=True)
    return dest, st.party, st.sequence
