"""Revocation: a party's deny-list of certificate fingerprints, checked on every request (issue #27).

The deny-list is a text file, one pinned fingerprint per line (``sha256:<hex>`` or ``spki-sha256:<hex>``, as
``modelward party fingerprint`` prints them), optionally followed by ``# name, when``; ``modelward party revoke
NAME PARTY.toml`` appends the pin of peer NAME to the party's list. A running party re-reads the file when it
changes (one ``stat`` per request), so a revoked peer is refused from its next request on — within one step —
and every refusal is audited (:func:`modelward.governance.party.gate.not_revoked`). Revocation is by pin, not by
name: the revoked key stays refused even if it is later pinned under another name; re-admitting a peer is a new
key (``party keygen --force``) and a new pin.

The same list is checked on the client side (:func:`revoked_server_check`): the driver's and a party's gRPC
clients compare the server's certificate (its pin, its certificate and public-key fingerprints) with their own
deny-list when they connect and before every call, so a revoked server is refused by the caller too, from its
next call on, without a byte of the request leaving.

Example:
    >>> deny = DenyList(tmp_path / "revoked.txt")  # doctest: +SKIP
    >>> revoke(deny.path, "sha256:ab…", "alice"); deny.reason("sha256:ab…")  # doctest: +SKIP
    'certificate sha256:ab… is revoked (alice, 2026-11-25T21:30:00Z)'
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path

from modelward.core.records import atomic_write_text
from modelward.errors import IdentityError
from modelward.governance.trust.identity import (
    cert_fingerprint,
    normalize_fingerprint,
    public_key_fingerprint,
)

#: ``check(name, address, pin, server_cert_pem) -> None``, raising when the server must not be called
PeerCheck = Callable[[str, str, "str | None", "bytes | None"], None]


class RevokedPeer(IdentityError):
    """The peer's certificate is on this side's deny-list: it is not called (client) or not answered (server)."""


class DenyList:
    """The revoked fingerprints in `path` (absent file: none), re-read whenever the file changes.

    Args:
        path: the deny-list file.

    Returns:
        ``reason(fingerprint)``: why that pin is refused, or None.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._stamp: tuple[int, int] | None = None
        self._entries: dict[str, str] = {}
        self._lock = threading.Lock()

    def _load(self) -> dict[str, str]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._stamp, self._entries = None, {}
            return self._entries
        stamp = (st.st_mtime_ns, st.st_size)
        with self._lock:
            if stamp != self._stamp:
                self._entries = read_deny_list(self.path)
                self._stamp = stamp
            return self._entries

    def reason(self, fingerprint: str | None) -> str | None:
        """Why `fingerprint` is refused (it is on the list), or None."""
        if fingerprint is None:
            return None
        note = self._load().get(fingerprint)
        if note is None:
            return None
        return f"certificate {fingerprint} is revoked" + (f" ({note})" if note else "")

    def first_reason(self, fingerprints: Iterable[str]) -> str | None:
        """Why the first revoked one of `fingerprints` is refused (one ``stat`` for all of them), or None."""
        entries = self._load()
        for fp in fingerprints:
            note = entries.get(fp)
            if note is not None:
                return f"certificate {fp} is revoked" + (f" ({note})" if note else "")
        return None


def revoked_server_check(deny: DenyList) -> PeerCheck:
    """The client-side check (a hook of :class:`~modelward.governance.transport.client.GrpcPartyClient`): refuse
    a server whose pin, certificate fingerprint or public-key fingerprint is on `deny`.

    Args:
        deny: the caller's deny-list (a party's ``revoked_file``, the driver's ``revoked_file``).
    Returns:
        ``check(name, address, pin, server_cert_pem)``, called at every connection check (with the certificate
        the server presented) and before every call (with the last one seen); raises :class:`RevokedPeer`.
    Example:
        >>> check = revoked_server_check(DenyList("revoked.txt"))  # doctest: +SKIP
        >>> check("bob", "10.0.0.2:50062", "sha256:ab…", None)  # doctest: +SKIP
        Traceback (most recent call last):
        RevokedPeer: party bob at 10.0.0.2:50062 is refused by this side: certificate sha256:ab… is revoked (…)
    """
    seen: dict[bytes, tuple[str, str]] = {}  # the last certificate's fingerprints (parsed once, not per call)

    def check(name: str, address: str, pin: str | None, cert_pem: bytes | None) -> None:
        fps = [normalize_fingerprint(pin, f"pin of {name}")] if pin else []
        if cert_pem:
            got = seen.get(cert_pem)
            if got is None:
                got = (cert_fingerprint(cert_pem), public_key_fingerprint(cert_pem))
                seen.clear()
                seen[cert_pem] = got
            fps += got
        reason = deny.first_reason(fps)
        if reason:
            raise RevokedPeer(f"party {name} at {address} is refused by this side: its {reason} (deny-list "
                              f"{deny.path})")

    return check


def read_deny_list(path: str | Path) -> dict[str, str]:
    """``{fingerprint: note}`` from a deny-list file (blank lines and ``#`` comments skipped; a malformed line is
    a ConfigError naming the file and the line)."""
    out: dict[str, str] = {}
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        fp, _, note = line.partition("#")
        if fp.strip():
            out[normalize_fingerprint(fp.strip(), f"{path}:{i}")] = note.strip()
    return out


def revoke(path: str | Path, fingerprint: str, name: str = "") -> bool:
    """Add `fingerprint` (of peer `name`) to the deny-list at `path` (created if absent; written atomically).

    Returns:
        False if it was already revoked, True if added.
    """
    p = Path(path)
    fp = normalize_fingerprint(fingerprint, "fingerprint")
    current = read_deny_list(p) if p.is_file() else {}
    if fp in current:
        return False
    when = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    old = p.read_text() if p.is_file() else ""
    if old and not old.endswith("\n"):
        old += "\n"
    atomic_write_text(p, old + f"{fp}  # {name + ', ' if name else ''}{when}\n")
    return True
