"""How one process talks to a party: the :class:`PartyClient` interface, over gRPC + mutual TLS or in-process.

The driver and every party (towards its next neighbour) use the same interface. :class:`GrpcPartyClient` checks
the server before the first call with a plain TLS handshake: it fails fast with a message naming the certificate
at fault (our CA file, our certificate, the server's certificate) instead of a gRPC retry loop, and it compares
the server's certificate with the pinned fingerprint (a valid certificate with the right name from another trusted
CA is refused). An optional ``peer_check`` hook (the caller's deny-list,
:func:`~modelward.governance.trust.revocation.revoked_server_check`) is asked with the pin before that check, with
the server's certificate at it, and again before every call. :class:`InProcessClient` calls an
:class:`~modelward.governance.protocol.Endpoint` (a party) directly (unit tests: a whole chain in one process, same
code path from the wire bytes on).
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable

import grpc

from modelward.errors import ConfigError, IdentityError, ModelwardError
from modelward.governance.party.config import TLSConfig
from modelward.governance.protocol import (
    ConsentDenied,
    Endpoint,
    LinkStats,
    NumericError,
    PartyError,
    PartyUnavailable,
    StepRolledBack,
    raw_bytes,
)
from modelward.governance.transport.credentials import (
    CERT_METADATA,
    KeyPairFiles,
    channel_credentials,
    version_of,
)
from modelward.governance.trust.identity import cert_fingerprint, identify_peer
from modelward.governance.trust.revocation import PeerCheck
from modelward.governance.trust.rotation import PeerTrust
from modelward.governance.wire import Message, WireError, decode, encode

SERVICE = "modelward.Party"
METHOD = f"/{SERVICE}/Call"


class TLSSetupError(ConfigError):
    """A certificate problem found before any request: names the certificate at fault."""


# status codes <-> error classes (a party re-raises its neighbour's error class, so the driver sees the cause)
CODES: dict[type[ModelwardError], grpc.StatusCode] = {
    ConsentDenied: grpc.StatusCode.PERMISSION_DENIED, IdentityError: grpc.StatusCode.UNAUTHENTICATED,
    NumericError: grpc.StatusCode.OUT_OF_RANGE, StepRolledBack: grpc.StatusCode.ABORTED,
    WireError: grpc.StatusCode.INVALID_ARGUMENT,
    PartyError: grpc.StatusCode.FAILED_PRECONDITION, PartyUnavailable: grpc.StatusCode.UNAVAILABLE,
}
ERRORS: dict[grpc.StatusCode, type[ModelwardError]] = {c: t for t, c in CODES.items()}
ERRORS[grpc.StatusCode.DEADLINE_EXCEEDED] = PartyUnavailable
ERRORS[grpc.StatusCode.RESOURCE_EXHAUSTED] = WireError


def code_of(e: ModelwardError) -> grpc.StatusCode:
    """The gRPC status code a party answers error `e` with (its class, or its nearest mapped base class)."""
    for t in type(e).__mro__:
        if t in CODES:
            return CODES[t]
    return grpc.StatusCode.INVALID_ARGUMENT


class InProcessClient:
    """Calls ``party.handle(caller, bytes)`` directly: the same encode/decode, checks and audit as over gRPC.

    Args:
        party: what serves the requests: a party, or any :class:`~modelward.governance.protocol.Endpoint`.
        caller: the pinned name the requests come from (what a transport would have identified).

    Example:
        >>> c = InProcessClient(bob, caller="alice")  # doctest: +SKIP
        >>> c.call(Message("status")).meta["party"]  # doctest: +SKIP
        'bob'
    """

    def __init__(self, party: Endpoint, caller: str) -> None:
        self.party, self.caller, self.name = party, caller, party.name
        self.stats = LinkStats()

    def call(self, msg: Message, timeout: float | None = None) -> Message:
        req = encode(msg)
        t0 = time.perf_counter()
        try:
            resp = self.party.handle(self.caller, req)
        except BaseException:
            self.stats.add(0, 0, 0, time.perf_counter() - t0, calls=0)
            raise
        seconds = time.perf_counter() - t0
        out = decode(resp, max_bytes=2**40, allow_nonfinite=True)
        self.stats.add(len(req), len(resp), raw_bytes(msg) + raw_bytes(out), seconds)
        return out

    def close(self) -> None:
        pass


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"address {address!r}: expected host:port, e.g. 127.0.0.1:50062")
    return host.strip("[]"), int(port)


def check_server(name: str, address: str, tls: TLSConfig, pin: str | None, timeout: float = 10.0,
                 identify: Callable[[bytes], str] | None = None, extra_roots: bytes = b"",
                 peer_check: PeerCheck | None = None) -> str:
    """One TLS handshake with the server at `address`, presenting our certificate: returns the server
    certificate's fingerprint. Raises TLSSetupError naming the certificate at fault, IdentityError when the server
    is not the pinned one (or `peer_check`, given the server's certificate, refuses it: e.g. revoked),
    PartyUnavailable when nothing listens (the only retryable outcome). With `identify` (a
    :class:`~modelward.governance.trust.rotation.PeerTrust`'s), the server must be `name` by it (a rotation
    statement it carries is followed); `extra_roots` are trusted next to ``tls.ca``."""
    host, port = split_address(address)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False  # who the server is follows from the pin (or, without one, from gRPC's name check)
    try:
        ctx.load_verify_locations(cafile=tls.ca)
        if extra_roots:
            ctx.load_verify_locations(cadata=extra_roots.decode())
    except (OSError, ssl.SSLError) as e:
        raise TLSSetupError(f"tls.ca {tls.ca}: cannot be used as CA certificate(s): {e}") from None
    for attempt in range(2):
        try:
            ctx.load_cert_chain(tls.cert, tls.key)
            break
        except (OSError, ssl.SSLError) as e:
            if attempt == 0:  # `party rotate` may be half-way (the new certificate written, its key next)
                time.sleep(0.2)
                continue
            raise TLSSetupError(f"tls.cert {tls.cert} / tls.key {tls.key}: cannot be loaded together ({e}); is the "
                                "key the one the certificate was made for?") from None
    ctx.set_alpn_protocols(["h2"])
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as e:
        raise PartyUnavailable(f"party {name} at {address} is not reachable ({e.strerror or e}); is it started?") \
            from None
    try:
        with ctx.wrap_socket(sock) as s:
            der = s.getpeercert(binary_form=True)
            # TLS 1.3: the server judges our certificate after the handshake; its verdict arrives with the first
            # read (the HTTP/2 settings frame if accepted, an alert if not)
            s.settimeout(min(timeout, 5.0))
            try:
                first = s.recv(1)
            except TimeoutError:
                first = b"?"  # no verdict in time: let gRPC find out
            if not first:
                raise TLSSetupError(f"party {name} at {address} closed the connection right after the TLS "
                                    f"handshake: it refused our certificate tls.cert {tls.cert} (not signed by a "
                                    f"CA that {name} trusts)")
    except ssl.SSLCertVerificationError as e:
        raise TLSSetupError(f"the certificate of party {name} at {address} is not signed by a CA in tls.ca "
                            f"{tls.ca} ({e.verify_message}); give the CA that signed {name}'s certificate") from None
    except ssl.SSLError as e:
        reason = str(e.reason or e).lower()
        if any(w in reason for w in ("unknown_ca", "unknown ca", "bad_certificate", "certificate_required",
                                     "certificate required", "bad certificate", "handshake_failure")):
            raise TLSSetupError(f"party {name} at {address} refused our certificate tls.cert {tls.cert} "
                                f"({e.reason}): it is not signed by a CA that {name} trusts") from None
        raise PartyUnavailable(f"TLS with party {name} at {address} failed: {e}") from None
    except OSError as e:
        raise PartyUnavailable(f"party {name} at {address}: connection lost during the TLS handshake ({e})") \
            from None
    pem = ssl.DER_cert_to_PEM_cert(der).encode()
    if identify is not None:
        try:
            who = identify(pem)
        except IdentityError as e:
            raise IdentityError(f"the server at {address} is not the pinned party {name}: {e}") from None
        if who != name:
            raise IdentityError(f"the server at {address} is party {who!r}, not {name!r}")
    elif pin is not None:
        try:
            identify_peer(pem, {name: pin})
        except IdentityError as e:
            raise IdentityError(f"the server at {address} is not the pinned party {name}: {e}") from None
    if peer_check is not None:
        peer_check(name, address, pin, pem)
    return cert_fingerprint(pem)


CONNECT_TIMEOUT_S = 20.0  # one connection attempt: several round trips at any RTT a consortium would run across


class GrpcPartyClient:
    """A mutual-TLS gRPC channel to one party (see the module docstring for the up-front check).

    Key rotation (:mod:`modelward.governance.trust.rotation`): when our ``tls.key``/``tls.cert`` change (``party
    rotate``), the next call goes over a fresh channel with the new pair; when the server says (trailing metadata)
    that it now presents another certificate, the next call checks it again — following its rotation statement
    through `trust` — over a fresh channel. Channels left behind are closed with the client (a call still in
    flight on one finishes there)."""

    def __init__(self, name: str, address: str, tls: TLSConfig, pin: str | None = None,
                 max_message_mb: float = 64.0, timeout: float = 60.0, check: bool = True,
                 connect_timeout: float = CONNECT_TIMEOUT_S, trust: PeerTrust | None = None,
                 peer_check: PeerCheck | None = None) -> None:
        self.name, self.address, self.tls, self.pin, self.timeout = name, address, tls, pin, timeout
        self.connect_timeout = connect_timeout
        self.trust = trust
        self.peer_check = peer_check  # e.g. the caller's deny-list: at every connection check and before every call
        self._server_pem: bytes | None = None  # the certificate the server presented at the last check
        self.stats = LinkStats()
        self._checked = not check
        self._server_fp: str | None = None  # the certificate the last check saw
        self.max_bytes = int(max_message_mb * 2**20) + 65536
        self.pair = KeyPairFiles(tls.key, tls.cert)
        self._old_channels: list[grpc.Channel] = []
        self._build()

    def _build(self) -> None:
        """A channel from the current key pair and trust bundle."""
        self._built = version_of(self.pair, self.trust)
        creds = channel_credentials(self.tls, self.pair, self.trust)
        self.channel = grpc.secure_channel(self.address, creds, options=[
            ("grpc.ssl_target_name_override", self.name),
            ("grpc.max_receive_message_length", self.max_bytes), ("grpc.max_send_message_length", self.max_bytes),
            # a restarted party is found within a second (the first retry after 200 ms, then at most 1 s apart)
            ("grpc.initial_reconnect_backoff_ms", 200), ("grpc.max_reconnect_backoff_ms", 1000),
            # gRPC also takes the *minimum* reconnect backoff as the deadline of one connection attempt (TCP + TLS
            # 1.3 + HTTP/2, ~3 round trips): at 200 ms no handshake over a 100 ms link ever completed
            ("grpc.min_reconnect_backoff_ms", int(self.connect_timeout * 1000))])
        self.stub = self.channel.unary_unary(METHOD)

    def _renew(self) -> None:
        """A fresh channel when our key pair or the trust bundle changed since this one was built."""
        if version_of(self.pair, self.trust) != self._built:
            self._old_channels.append(self.channel)
            while len(self._old_channels) > 4:  # long idle: nothing is in flight there any more
                self._old_channels.pop(0).close()
            self._build()

    def check(self) -> None:
        if not self._checked:
            self.check_peer()  # a pin revoked already is refused before any connection
            trust = self.trust
            self._server_fp = check_server(
                self.name, self.address, self.tls, self.pin, timeout=min(self.timeout, max(self.connect_timeout, 10.0)),
                identify=trust.identify if trust is not None else None,
                extra_roots=trust.roots() if trust is not None else b"",
                peer_check=None if self.peer_check is None else self._seen)
            if trust is not None:
                self.pin = trust.pins.get(self.name, self.pin)
            self._checked = True
            self._renew()
        else:
            self.check_peer()

    def check_peer(self) -> None:
        """Ask the ``peer_check`` hook about the server seen at the last check (no network; e.g. revoked since)."""
        if self.peer_check is not None:
            self.peer_check(self.name, self.address, self.pin, self._server_pem)

    def _seen(self, name: str, address: str, pin: str | None, pem: bytes | None) -> None:
        self._server_pem = pem
        self.peer_check(name, address, pin, pem)

    def call(self, msg: Message, timeout: float | None = None) -> Message:
        self._renew()
        self.check()
        req = encode(msg)
        t0 = time.perf_counter()
        try:
            resp, rpc = self.stub.with_call(req, timeout=timeout or self.timeout)
        except grpc.RpcError as e:
            self.stats.add(0, 0, 0, time.perf_counter() - t0, calls=0)
            code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
            kind = ERRORS.get(code, PartyError)
            detail = e.details() if hasattr(e, "details") else str(e)
            if kind is PartyUnavailable:
                self._checked = False  # check the server again once it is back (it may be another one)
                detail = f"party {self.name} at {self.address} unreachable: {detail}"
            raise kind(detail) from None
        seconds = time.perf_counter() - t0
        self._watch(rpc)
        out = decode(resp, max_bytes=self.max_bytes, allow_nonfinite=True)
        self.stats.add(len(req), len(resp), raw_bytes(msg) + raw_bytes(out), seconds)
        return out

    def _watch(self, rpc: grpc.Call) -> None:
        """The server now presents another certificate (it rotated its key): check it before the next call, over
        a fresh connection (this one was authenticated under the old key and stays usable meanwhile)."""
        if self._server_fp is None:
            return
        for k, v in rpc.trailing_metadata() or ():
            if k == CERT_METADATA and v != self._server_fp:
                self._checked = False
                self._built = (-1, -1)  # a fresh channel: a new handshake meets the new certificate
                break

    def close(self) -> None:
        for ch in self._old_channels:
            ch.close()
        self._old_channels.clear()
        self.channel.close()
