"""gRPC transport of a party: mutual TLS, the caller identified by its pinned certificate fingerprint.

One generic bytes-in/bytes-out method (framing in :mod:`modelward.governance.wire`; the admission checks in
:mod:`modelward.governance.party.gate`). The TLS handshake admits
certificates from the configured CA(s); *who* the caller is then follows only from the pinned fingerprints
(:class:`modelward.governance.trust.rotation.PeerTrust` on the ``x509_pem_cert`` of the auth context: the pins,
followed through a peer's signed key rotation), before any byte of the request body is decoded. An unpinned
certificate — whatever its common name or CA — is refused and audited (rate-limited). The server's own key pair is
re-read when it is rotated (:mod:`modelward.governance.transport.credentials`): new handshakes get the new
certificate without a restart.
"""

from __future__ import annotations

import faulthandler
import queue
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import grpc

from modelward.core.lock import FolderLock
from modelward.core.process import keep_freed_memory
from modelward.core.threads import torch_thread_pool
from modelward.errors import ConfigError, IdentityError, ModelwardError
from modelward.governance.party.config import PartyConfig, check_test_only, pins, revoked_path
from modelward.governance.party.machine import Connect, Party
from modelward.governance.protocol import PartyClient
from modelward.governance.transport.client import SERVICE, GrpcPartyClient, code_of
from modelward.governance.transport.credentials import CERT_METADATA, KeyPairFiles, server_credentials
from modelward.governance.trust.identity import cert_fingerprint, normalize_pins
from modelward.governance.trust.revocation import DenyList, revoked_server_check
from modelward.governance.trust.rotation import PeerTrust, RotationStore


class PartyServer:
    """Serve one :class:`Party` over gRPC with mutual TLS (see the module docstring)."""

    def __init__(self, party: Party, workers: int = 8, port: int | None = None) -> None:
        self.party = party
        cfg = party.cfg
        port = cfg.port if port is None else port
        # the largest legitimate message (rows x the widest tensor, party.message_limit, at most max_message_mb):
        # gRPC drops a longer one from its length prefix, before buffering it and before any identity check
        limit = party.message_limit
        self.server = grpc.server(torch_thread_pool(workers, "grpc"),
                                  options=[("grpc.max_receive_message_length", limit),
                                           ("grpc.max_send_message_length", limit),
                                           ("grpc.so_reuseport", 0)])
        handler = grpc.method_handlers_generic_handler(SERVICE, {"Call": grpc.unary_unary_rpc_method_handler(
            self._call)})
        self.server.add_generic_rpc_handlers((handler,))
        # who a presented certificate is: the pins, followed through rotation statements, the deny-list applied
        # to the certificate itself; shared with the party's link to its next neighbour
        self.trust = party_trust(party)
        if getattr(party._connect, "trust", False) is None:
            party._connect.trust = self.trust  # type: ignore[union-attr]
        # the key pair is re-read when `party rotate` replaces it: new handshakes get the new certificate
        self.pair = KeyPairFiles(cfg.tls.key, cfg.tls.cert)
        creds = server_credentials(cfg.tls, self.pair, self.trust)
        try:
            self.port = self.server.add_secure_port(f"{cfg.host}:{port}", creds)
        except RuntimeError:  # grpcio >= 1.60 raises instead of returning 0
            self.port = 0
        if self.port == 0:
            raise ConfigError(f"party {cfg.name}: cannot listen on {cfg.host}:{port}: the address is in use "
                              "(another party server?) or not local; set `port` (0 = any free port) or `host`")

    def identify(self, pem: bytes) -> str:
        return self.trust.identify(pem)

    def _call(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        pem = (context.auth_context().get("x509_pem_cert") or [b""])[0]
        # the certificate this server presents now (a client connected before a key rotation checks the new one)
        self.pair.refresh()
        context.set_trailing_metadata(((CERT_METADATA, self.pair.fingerprint),))
        try:
            caller = self.identify(pem)
        except IdentityError as e:
            try:
                who = "unpinned " + cert_fingerprint(pem)[:23]
            except IdentityError:
                who = "unpinned (no certificate)"
            self.party.audit.refusal(who, "(identity)", str(e), self.party.cfg.audit_refusals_every_s,
                                     batch=len(request))
            context.abort(grpc.StatusCode.UNAUTHENTICATED, f"party {self.party.cfg.name}: {e}")
        try:
            return self.party.handle(caller, request)
        except ModelwardError as e:
            context.abort(code_of(e), str(e))
        except Exception as e:  # a bug must not take the party down; the state lock guarantees consistency
            context.abort(grpc.StatusCode.INTERNAL, f"party {self.party.cfg.name}: internal error "
                                                    f"{type(e).__name__}: {e}")
        raise AssertionError("unreachable")

    def start(self) -> int:
        self.server.start()
        return self.port

    def stop(self, grace: float = 5.0) -> None:
        self.server.stop(grace).wait()
        self.party.close()


def describe(party: Party, port: int) -> str:
    c = party.cfg
    role = "first (inputs)" if party.is_first else "last (labels, loss)" if party.is_last else "middle"
    n = sum(p.numel() for p in party.params.values())
    pol = c.policy
    init = ("own checkpoint " + str(c.init.checkpoint) if c.init.checkpoint else
            f"TEST-ONLY public seed {c.init.test_seed}" if c.init.test_seed is not None else
            f"{c.init.scheme} from the OS CSPRNG")
    return (f"party {c.name}: listening on {c.host}:{port} (mutual TLS, peers pinned by fingerprint)\n"
            f"  layers {c.layers} of {party.all_layers} — role {role}, {n} parameters, init {init}\n"
            f"  chain: prev {c.prev or '(driver)'}, next {c.next or '(none: holds the labels)'}, driver {c.driver}\n"
            f"  step {party.step}, checkpoints every {c.checkpoint_every} steps in {c.checkpoint_dir}\n"
            f"  audit log {c.audit_db} (head {party.audit.head[:16]}…)\n"
            f"  policy: peers {pol.allow_peers}, training={pol.training}, inference={pol.inference}, "
            f"max_batch={pol.max_batch}, steps per session/day/total={pol.max_steps_per_session}/"
            f"{pol.max_steps_per_day}/{pol.max_steps_total}, max_passes_per_day={pol.max_passes_per_day}, "
            f"window={pol.window_utc}, approval={pol.approval or pol.approval_command}")


class TLSRefusalMonitor:
    """Audit TLS handshakes the server refused before any identity existed (an unknown CA, no client certificate,
    not TLS at all). gRPC drops such connections inside its C core, which only logs them (``Handshake failed …``
    on standard error); the party server routes its standard error through a pipe, forwards every line unchanged
    and records each handshake refusal in the audit log, rate-limited like the other refusals. The peer's
    address is not known at that level; the record names the TLS error.

    Args:
        party: the party whose audit log records the refusals.
        fd: the file descriptor to watch (standard error).

    Returns:
        A context manager; on exit standard error is restored.

    Example:
        >>> with TLSRefusalMonitor(party):  # doctest: +SKIP
        ...     server.start()
    """

    MARK = "Handshake failed"

    def __init__(self, party: Party, fd: int = 2) -> None:
        self.party, self.fd = party, fd
        self.seen = 0  # handshake refusals noticed (recorded or rate-limited)

    def __enter__(self) -> TLSRefusalMonitor:
        import os

        self.active = False
        try:
            self._saved = os.dup(self.fd)
        except OSError:  # no standard error to watch (closed): nothing gRPC logs can be seen, nor audited
            return self
        read, self._write = os.pipe()
        os.dup2(self._write, self.fd)
        # the pump only forwards and spots lines (it must drain the pipe promptly: a writer blocked on a full
        # pipe may hold locks gRPC needs); the audit records, which wait on SQLite, are written by the recorder
        self._lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._pump, args=(read,), name="tls-refusals", daemon=True)
        self._recorder = threading.Thread(target=self._record_all, name="tls-refusals-audit", daemon=True)
        self._thread.start()
        self._recorder.start()
        self.active = True
        return self

    def _pump(self, read: int) -> None:
        import os

        mark = self.MARK.encode()
        with os.fdopen(read, "rb", buffering=0) as pipe:
            pending = b""
            while chunk := pipe.read(65536):
                try:
                    os.write(self._saved, chunk)  # the log stays as it was
                except OSError:
                    pass
                pending += chunk
                *lines, pending = pending.split(b"\n")
                pending = pending[-65536:]
                for line in lines:
                    if mark in line:
                        self.seen += 1
                        self._lines.put(line.decode("utf-8", "replace"))

    def _record_all(self) -> None:
        while (line := self._lines.get()) is not None:
            detail = line.split(self.MARK, 1)[1].strip(" :")
            detail = detail.removeprefix("with error ")[:300]
            try:  # never let auditing take the recorder down
                self.party.audit.refusal("(unauthenticated TLS client)", "(tls handshake)",
                                         f"TLS handshake refused before any identity was established: {detail}",
                                         self.party.cfg.audit_refusals_every_s)
            except Exception:  # noqa: BLE001 - the log line itself is forwarded anyway
                pass

    def __exit__(self, *exc: object) -> None:
        import os
        import sys

        if not self.active:
            return
        self.active = False
        sys.stderr.flush()
        os.dup2(self._saved, self.fd)  # the pipe's last writer goes: the pump reads to the end and stops
        os.close(self._write)
        self._thread.join(5.0)
        self._lines.put(None)
        self._recorder.join(5.0)
        os.close(self._saved)


def _write_address(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _port_file(cfg: PartyConfig) -> Path:
    """Where a party with ``port = 0`` keeps the port it last listened on (its neighbours know it by it)."""
    return Path(cfg.checkpoint_dir) / "port"


def _server(party: Party) -> PartyServer:
    """The party's server. With ``port = 0`` it first tries the port it listened on before (a restart is then
    found where it was, by neighbours that are themselves restarting too); when that one is taken, any free
    port, which the party announces to its neighbours in its anchor exchange (audit.Anchoring)."""
    cfg = party.cfg
    last = _port_file(cfg)
    if cfg.port == 0 and last.is_file() and last.read_text().strip().isdigit():
        try:
            return PartyServer(party, port=int(last.read_text().strip()))
        except ConfigError:
            pass  # taken meanwhile: a new one
    return PartyServer(party)


def _lock(cfg: PartyConfig):
    """The party's state folder is used by one server at a time (a second `party serve` is refused, naming the
    holder; a lock left by a killed server on this host is taken over)."""
    return FolderLock(cfg.checkpoint_dir, what="party")


def _shut_down(party: Party) -> None:
    """A clean stop: an uncommitted step rolled back, a checkpoint of the current step, the audit log closed."""
    party.rest()
    party.close()


def party_trust(party: Party) -> PeerTrust:
    """A party's :class:`~modelward.governance.trust.rotation.PeerTrust`: its pins (followed in place through
    rotations, persisted in ``<checkpoint_dir>/rotations.json``), its deny-list, ``rotation_overlap_s``, the inbox
    ``<checkpoint_dir>/rotations-inbox`` (statement files of cross-pinned peers), every rotation accepted or
    pin retired recorded in its audit log (operation ``(rotation)``).

    Args:
        party: the party.

    Returns:
        The trust object its server and its links share.

    Example:
        >>> trust = party_trust(party); trust.identify(alice_new_pem)  # doctest: +SKIP
        'alice'
    """
    cfg = party.cfg

    def record(who: str, decision: str, message: str) -> None:
        party.audit.append(who, "(rotation)", decision=decision, reason=message)

    return PeerTrust(party.pins, RotationStore(Path(cfg.checkpoint_dir) / "rotations.json"), party.deny,
                     cfg.rotation_overlap_s, inbox=Path(cfg.checkpoint_dir) / "rotations-inbox", on_event=record)


def grpc_link(cfg: PartyConfig) -> Connect:
    """How a party served here reaches its next neighbour: gRPC + mutual TLS with the party's certificate, the
    neighbour pinned by its fingerprint and checked against the party's deny-list at every connection and call
    (a revoked next party is refused by this side too).

    Args:
        cfg: the party's configuration.

    Returns:
        ``connect(name, address) -> PartyClient`` for :class:`~modelward.governance.party.machine.Party`.

    Example:
        >>> party = Party(cfg, connect=grpc_link(cfg))  # doctest: +SKIP
    """
    peer_pins = normalize_pins(pins(cfg), f"party {cfg.name}: peers")
    not_revoked = revoked_server_check(DenyList(revoked_path(cfg)))

    def connect(name: str, address: str) -> PartyClient:
        limit_mb = cfg.max_message_mb if connect.max_bytes is None else connect.max_bytes / 2**20
        trust = connect.trust
        return GrpcPartyClient(name, address, cfg.tls, trust.pins.get(name) if trust else peer_pins[name],
                               limit_mb, cfg.timeout_s, connect_timeout=cfg.connect_timeout_s, trust=trust,
                               peer_check=not_revoked)

    # the party sets its message limit here once it knows its shapes: replies beyond it are dropped unbuffered too
    connect.max_bytes = None  # type: ignore[attr-defined]
    # the party's PeerTrust, once its server (or host) made it: the link follows the next party's key rotations
    connect.trust = None  # type: ignore[attr-defined]
    return connect


@contextmanager
def hosted_party(cfg: PartyConfig) -> Iterator[Party]:
    """A party run inside the caller's process instead of behind its own server: the organisation that drives
    the training hosts its own party next to the driver (``modelward split train --host PARTY.toml``), which
    saves one network hop per step. The same state machine, consent checks and audit log; the party still
    reaches its next neighbour over mutual TLS, and its state folder is locked as by ``party serve``.

    Args:
        cfg: the hosted party's configuration (paths resolved).

    Returns:
        A context manager yielding the :class:`Party`; on exit it stops cleanly (uncommitted step rolled back,
        checkpoint saved, audit log closed).

    Example:
        >>> from modelward.governance.party.config import load_party_config
        >>> with hosted_party(load_party_config("parties/alice.toml")) as alice:  # doctest: +SKIP
        ...     run_training(load_split_config("split.toml"), host=alice)
    """
    check_test_only(cfg)
    Path(cfg.checkpoint_dir).mkdir(parents=True, exist_ok=True)
    with _lock(cfg):
        link = grpc_link(cfg)
        party = Party(cfg, connect=link)
        link.trust = party_trust(party)  # type: ignore[attr-defined]
        try:
            yield party
        finally:
            _shut_down(party)


def serve(cfg: PartyConfig, log=print, stop_event: threading.Event | None = None, audit_tls: bool = True,
          party_type: type[Party] = Party) -> None:
    """Run a party until SIGTERM/SIGINT (or `stop_event`); shut down gracefully, saving a checkpoint.

    Args:
        cfg: the party's :class:`~modelward.governance.party.config.PartyConfig`.
        log: where status lines go (default ``print``).
        stop_event: set it to stop the server from another thread.
        audit_tls: record refused TLS handshakes in the audit log (:class:`TLSRefusalMonitor`; it takes over
            this process's standard error, so pass False when several servers share one process).
        party_type: the :class:`Party` class to serve (a subclass adds to it, e.g. the leakage audit's recorder).

    Returns:
        None, once the server has stopped.

    Example:
        >>> from modelward.governance.party.config import load_party_config
        >>> serve(load_party_config("parties/alice.toml"))  # blocks until SIGTERM  # doctest: +SKIP
    """
    check_test_only(cfg)
    Path(cfg.checkpoint_dir).mkdir(parents=True, exist_ok=True)
    keep_freed_memory()  # a message buffer per step: reuse freed memory rather than page-fault it back in
    with _lock(cfg):
        party = party_type(cfg, connect=grpc_link(cfg))
        try:
            server = _server(party)
        except BaseException:
            party.close()
            raise
        with TLSRefusalMonitor(party) if audit_tls else nullcontext():
            port = server.start()
            party.listen_address = f"{cfg.host}:{port}"  # given to its neighbours in the anchor exchange
            if cfg.port == 0:
                _write_address(_port_file(cfg), f"{port}\n")
            if cfg.address_file:
                _write_address(Path(cfg.address_file), f"{cfg.host}:{port}\n")
            log(describe(party, port))
            for w in party.warnings:  # e.g. one key holding both the data and the control role
                log(f"WARNING {w}")
            log(f"READY {cfg.name} {cfg.host}:{port}")
            stop = stop_event or threading.Event()
            received: list[str] = []

            def _handler(signum, _frame):  # no I/O here: the main loop reports it
                received.append(signal.Signals(signum).name)
                stop.set()

            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, _handler)
                signal.signal(signal.SIGINT, _handler)
            while not stop.wait(0.2):
                pass
            log(f"party {cfg.name}: received {received[0] if received else 'stop'}, shutting down")
        # standard error is back to normal before gRPC shuts down; a shutdown that hangs dumps every thread's
        # stack into the log (and the launcher's SIGKILL follows)
        try:
            faulthandler.dump_traceback_later(15.0, exit=False, file=sys.stdout)
        except (AttributeError, ValueError, OSError):  # a stdout without a file descriptor: no watchdog
            pass
        try:
            server.server.stop(1.0).wait()
            _shut_down(party)
        finally:
            faulthandler.cancel_dump_traceback_later()
        log(f"party {cfg.name}: stopped at step {party.step}")
