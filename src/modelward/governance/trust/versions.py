"""Monotonic consortium versions: a party refuses a kit older than one it has already accepted (issue 36 item 5).

Every kit's signed manifest carries the consortium's **version** (:class:`~.manifest.KitManifest`, set by
``modelward party provision``, one more than the last provisioning by the same signing key). Revoking a party is a
new version whose kits deny-list it; without a version check, the *older* kits — validly signed, with the revoked
party still trusted — could be replayed on a host and would start. So before a kit is used, the host compares its
version with the highest it has accepted from that consortium key (:func:`check_and_record`) and refuses an older
one; a kit at the same version (a restart) or newer passes and raises the mark.

Where the mark lives, and why a deleted state folder does not lower it: it is written to **two** places, and the
higher of the two counts:

1. ``<state folder>/kit-versions.json``, beside the party's deny-list and audit log;
2. ``<private key>.kit-versions.json``, beside the party's private key (``tls.key``).

Deleting (or restoring an old copy of) the state folder leaves the second; a host that loses its key folder has
lost its identity and cannot start with any kit (the kit's ``tls.key`` must be there and match the kit's
certificate: :func:`~modelward.governance.provisioning.open_party_kit`). Whoever can rewrite the key folder holds
the party's private key and *is* the party: no local record can stop them (they can also run an old modelward).
Both files are written atomically; a malformed one is an error naming it (fail closed), never silently reset.

Example:
    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> check_and_record("spki-sha256:" + "0" * 64, "digits", 2, [d / "state", d / "keys/alice.key"])
    2
    >>> check_and_record("spki-sha256:" + "0" * 64, "digits", 1, [d / "state", d / "keys/alice.key"])
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    modelward.governance.trust.versions.KitVersionError: consortium digits: this kit is version 1, older than version 2 this host has accepted (...); an old kit replayed (it may still trust a party revoked since): ask the provisioner for the current kit
"""

from __future__ import annotations

import json
import os
import time
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING

from modelward.errors import ModelwardError

if TYPE_CHECKING:  # (only for the annotations: manifest imports this module)
    from modelward.governance.trust.manifest import KitManifest

STATE_FILE = "kit-versions.json"
KEY_SUFFIX = ".kit-versions.json"


class KitVersionError(ModelwardError):
    """A kit older than one this host has accepted, or an unreadable version record."""


def version_files(state_dir: str | Path, key_file: str | Path) -> list[Path]:
    """The two places a host keeps its marks: in its state folder and beside its private key."""
    key_file = Path(key_file)
    return [Path(state_dir) / STATE_FILE, key_file.with_name(key_file.name + KEY_SUFFIX)]


def _read(path: Path) -> dict[str, dict]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or not all(isinstance(v, dict) and isinstance(v.get("version"), int)
                                                 for v in data.values()):
            raise ValueError("expected {consortium key: {version: int, ...}}")
        return data
    except (OSError, ValueError) as e:
        raise KitVersionError(f"{path}: unreadable kit-version record ({e}); it guards against replayed old kits: "
                              "restore it or, if you know the current consortium version, write it there") from None


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def highest(consortium_key: str, paths: list[Path]) -> int:
    """The highest version recorded for `consortium_key` in any of `paths` (0 when none)."""
    return max([0, *(int(_read(p).get(consortium_key, {}).get("version", 0)) for p in paths)])


def check(consortium_key: str, consortium: str, version: int, paths: list[Path]) -> None:
    """Refuse a kit older than the highest version accepted from `consortium_key` (nothing is written).

    Raises:
        KitVersionError: the kit is older (the message names where the newer version is recorded); or a record
            is unreadable.
    """
    seen = highest(consortium_key, paths)
    if version < seen:
        where = ", ".join(str(p) for p in paths if _read(p).get(consortium_key, {}).get("version", 0) == seen)
        raise KitVersionError(f"consortium {consortium}: this kit is version {version}, older than version {seen} "
                              f"this host has accepted ({where}); an old kit replayed (it may still trust a party "
                              "revoked since): ask the provisioner for the current kit")


def check_and_record(consortium_key: str, consortium: str, version: int, paths: list[Path]) -> int:
    """:func:`check`, then record `version` (when higher) in every one of `paths`.

    Args:
        consortium_key: the ``spki-sha256:`` fingerprint of the key that signed the kit (marks are per key).
        consortium: its name (for messages and the record).
        version: the verified kit's version.
        paths: where the marks are kept (:func:`version_files`).

    Returns:
        The version now recorded (= `version`).

    Raises:
        KitVersionError: the kit is older; or a record is unreadable.
    """
    check(consortium_key, consortium, version, paths)
    for p in paths:
        data = _read(p)
        if data.get(consortium_key, {}).get("version", -1) != version:
            data[consortium_key] = {"version": version, "consortium": consortium,
                                    "accepted": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            _write(p, data)
    return version


def kit_paths(kit: str | Path, m: KitManifest) -> list[Path]:
    """Where the host of a verified kit keeps its marks: the folder of the deny-list its configuration names
    (``revoked_file``) and beside its private key (``tls.key``), read from ``party.toml`` (or the driver's
    ``split.toml``) without loading anything heavy (a refusal must come before torch is imported).

    Raises:
        KitVersionError: the configuration names neither (not a kit ``party provision`` wrote).
    """
    kit = Path(kit)
    name = "split.toml" if m.role == "driver" else "party.toml"
    try:
        cfg = tomllib.loads((kit / name).read_text())
        state, key = cfg["revoked_file"], cfg["tls"]["key"]
    except (OSError, KeyError, TypeError, tomllib.TOMLDecodeError) as e:
        raise KitVersionError(f"kit {kit}: {name} names no revoked_file or tls.key ({e}); not a kit written by "
                              "`modelward party provision`") from None
    base = kit.resolve()
    return version_files((base / Path(state).expanduser()).parent, base / Path(key).expanduser())


def check_kit_version(kit: str | Path, m: KitManifest, record: bool) -> int:
    """A verified kit's consortium version against the highest this host has accepted from the same consortium
    key (:func:`kit_paths`); with `record`, raise the marks to it (a kit that starts).

    Returns:
        The kit's version.

    Raises:
        KitVersionError: the kit is older than one this host has accepted.
    """
    from modelward.governance.trust.manifest import signer_fingerprint  # (manifest imports this module)

    paths = kit_paths(kit, m)
    if record:
        return check_and_record(signer_fingerprint(m), m.consortium, m.version, paths)
    check(signer_fingerprint(m), m.consortium, m.version, paths)
    return m.version
