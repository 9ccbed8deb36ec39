"""Revocation: a party's deny-list of certificate fingerprints, checked on every request (issue #27).

The deny-list is a text file, one pinned fingerprint per line (``sha256:<hex>`` or ``spki-sha256:<hex>``, as
``modelward party fingerprint`` prints them), optionally followed by ``# name, when``; ``modelward party revoke
NAME PARTY.toml`` appends the pin of peer NAME to the party's list. A running party re-reads the file when it
changes (one ``stat`` per request), so a revoked peer is refused from its next request on — within one step —
and every refusal is audited (:func:`modelward.governance.party.gate.not_revoked`). Revocation is by pin, not by
name: the revoked key stays refused even if it is later pinned under another name; re-admitting a peer is a new
key (``party keygen --force``) and a new pin.

Example:
    >>> deny = DenyList(tmp_path / "revoked.txt")  # doctest: +SKIP
    >>> revoke(deny.path, "sha256:ab…", "alice"); deny.reason("sha256:ab…")  # doctest: +SKIP
    'certificate sha256:ab… is revoked (alice, 2026-11-25T21:30:00Z)'
"""

from __future__ import annotations

import os
import threading
from datetime import UTC, datetime
from pathlib import Path

from modelward.core.records import atomic_write_text
from modelward.governance.trust.identity import normalize_fingerprint


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
