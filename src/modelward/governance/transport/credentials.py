"""TLS credentials that follow their files: a party swaps its key and certificate without restarting.

:class:`KeyPairFiles` re-reads ``tls.key`` / ``tls.cert`` when they change (one ``stat`` each) and takes a new pair
only once the key belongs to the certificate (``party rotate`` writes the certificate, then the key: the half-way
state is never loaded). The server's credentials are gRPC's *dynamic* SSL credentials: gRPC asks
:func:`server_credentials`' fetcher before every new TLS handshake, so new connections get the new certificate
(and the trust bundle ``tls.ca`` plus the certificates followed by rotation) while connections already made keep
theirs. A client (:class:`~modelward.governance.transport.client.GrpcPartyClient`) builds a fresh channel when its
pair or its trust bundle changed (:func:`channel_credentials`).

Example:
    >>> pair = KeyPairFiles("certs/alice.key", "certs/alice.pem")  # doctest: +SKIP
    >>> creds, current = server_credentials(tls, pair, trust)  # doctest: +SKIP
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from modelward.errors import ConfigError
from modelward.governance.party.config import TLSConfig
from modelward.governance.trust.certs import read_pem
from modelward.governance.trust.identity import cert_fingerprint
from modelward.governance.trust.rotation import PeerTrust

CERT_METADATA = "modelward-cert"  # a server's current certificate fingerprint, in the trailing metadata


def _pair_matches(key_pem: bytes, cert_pem: bytes) -> bool:
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return False
    fmt = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return key.public_key().public_bytes(*fmt) == cert.public_key().public_bytes(*fmt)


class KeyPairFiles:
    """A private key and its certificate, re-read when either file changes, switched only as a matching pair.

    Args:
        key: the key file (``tls.key``); cert: the certificate file (``tls.cert``).
        min_interval_s: look at the files at most this often.

    Returns:
        ``current()`` -> ``(key PEM, cert PEM)``; ``version`` counts the switches; ``fingerprint`` is the current
        certificate's ``sha256:`` pin.
    """

    def __init__(self, key: str | Path, cert: str | Path, min_interval_s: float = 0.05) -> None:
        self.key, self.cert = Path(key), Path(cert)
        # the files are looked at no more often than this (two stats cost ~25 us on a busy host; a request
        # would pay them every time): a rotation is taken within min_interval_s
        self.min_interval_s = min_interval_s
        self._looked = time.monotonic()
        self.lock = threading.Lock()
        self.version = 0
        for attempt in range(2):
            key_pem, cert_pem = read_pem(self.key, "tls.key"), read_pem(self.cert, "tls.cert")
            if _pair_matches(key_pem, cert_pem):
                break
            if attempt == 0:  # `party rotate` may be half-way (the new certificate written, its key next)
                time.sleep(0.2)
        else:
            raise ConfigError(f"tls.key {self.key} does not belong to tls.cert {self.cert} (is the key the one the "
                              "certificate was made for?)")
        self._pair = (key_pem, cert_pem)
        self.fingerprint = cert_fingerprint(cert_pem)
        self._stamp = self._stat()

    def _stat(self) -> tuple:
        try:
            return tuple((s.st_mtime_ns, s.st_size, s.st_ino) for s in (os.stat(self.key), os.stat(self.cert)))
        except FileNotFoundError:
            return ()

    def refresh(self) -> bool:
        """Take the files' pair if they changed and match; returns whether the pair switched."""
        now = time.monotonic()
        if now - self._looked < self.min_interval_s:
            return False
        self._looked = now
        stamp = self._stat()
        if stamp == self._stamp or not stamp:
            return False
        with self.lock:
            if stamp == self._stamp:
                return False
            try:
                key_pem, cert_pem = self.key.read_bytes(), self.cert.read_bytes()
            except OSError:
                return False
            if not _pair_matches(key_pem, cert_pem):
                return False  # half-way through a rotation: keep the old pair, look again next time
            self._stamp = stamp
            if (key_pem, cert_pem) == self._pair:
                return False
            self._pair = (key_pem, cert_pem)
            self.fingerprint = cert_fingerprint(cert_pem)
            self.version += 1
            return True

    def current(self) -> tuple[bytes, bytes]:
        self.refresh()
        return self._pair


def trust_bundle(tls: TLSConfig, trust: PeerTrust | None) -> bytes:
    """``tls.ca`` plus the certificates followed by accepted rotations (cross-pinned peers' new certificates)."""
    ca = read_pem(tls.ca, "tls.ca")
    extra = trust.roots() if trust is not None else b""
    return ca if not extra else ca.rstrip(b"\n") + b"\n" + extra


def server_credentials(tls: TLSConfig, pair: KeyPairFiles, trust: PeerTrust | None = None
                       ) -> grpc.ServerCredentials:
    """Mutual-TLS server credentials that take a new key pair, ``tls.ca`` or followed rotation at the next
    handshake (gRPC's ``dynamic_ssl_server_credentials``; connections already made keep theirs).

    Args:
        tls: the party's TLS files; pair: its key pair (:class:`KeyPairFiles`); trust: its :class:`PeerTrust`.

    Returns:
        ``grpc.ServerCredentials`` requiring a client certificate.
    """
    state: dict[str, object] = {}

    def config() -> grpc.ServerCertificateConfiguration:
        key, cert = pair.current()
        try:
            ca_stamp = os.stat(tls.ca).st_mtime_ns
        except OSError:
            ca_stamp = None
        state["built"] = (pair.version, trust.version if trust is not None else 0, ca_stamp)
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=trust_bundle(tls, trust))

    initial = config()
    lock = threading.Lock()

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        # called by gRPC before each new handshake; None keeps the current configuration
        try:
            with lock:
                pair.refresh()
                try:
                    ca_stamp = os.stat(tls.ca).st_mtime_ns
                except OSError:
                    ca_stamp = None
                if trust is not None and trust.inbox is not None:
                    trust.pick_up()
                now = (pair.version, trust.version if trust is not None else 0, ca_stamp)
                return None if now == state["built"] else config()
        except Exception:  # noqa: BLE001 - a bad file must not stop the server: it keeps what it has
            return None

    return grpc.dynamic_ssl_server_credentials(initial, fetch, require_client_authentication=True)


def channel_credentials(tls: TLSConfig, pair: KeyPairFiles, trust: PeerTrust | None = None
                        ) -> grpc.ChannelCredentials:
    """A client's mutual-TLS credentials from its current key pair and trust bundle."""
    key, cert = pair.current()
    return grpc.ssl_channel_credentials(trust_bundle(tls, trust), key, cert)


def version_of(pair: KeyPairFiles, trust: PeerTrust | None) -> tuple[int, int]:
    """What a client's channel was built from (rebuild when it changes)."""
    pair.refresh()
    return pair.version, (trust.version if trust is not None else 0)
