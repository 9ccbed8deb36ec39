"""``modelward party start KIT``: run a kit's ``start.sh`` only after the whole kit — the script included — verifies.

A kit's ``start.sh`` is a file like any other in it: whoever can change the kit on its way can change the script,
and a script run as found runs before any check. So the documented way to start a kit is this command, which
trusts nothing in the kit until:

1. the kit verifies against the consortium key given out of band (signature, every file's SHA-256, no extra or
   missing file, the party it is for: :func:`~.manifest.verify_kit`);
2. its consortium version is not older than one this host has accepted (:mod:`~.versions`);
3. the bytes of ``start.sh`` it is about to run are the signed ones: read once, hashed, compared with the manifest,
   written to a private temporary file (mode 0700, a fresh folder) and executed from there with ``/bin/sh`` in
   the kit folder — a script swapped after the check is not the one that runs.

The script (written by ``party provision``) starts with ``modelward party verify-kit . --check-version`` itself, so
a kit run directly as ``./start.sh`` still verifies every *other* file before anything else runs; only this command
also covers the script.

Example:
    >>> start_kit("kits/bob", "spki-sha256:3b1f…", party="bob")  # doctest: +SKIP
    0
"""

from __future__ import annotations

import hashlib
import hmac
import os
import subprocess
import tempfile
from pathlib import Path

from modelward.governance.trust.manifest import ENV_KEY, ENV_PARTY, KitError, verify_kit
from modelward.governance.trust.versions import check_kit_version

KIT_DIR_ENV = "MODELWARD_KIT_DIR"  # the kit folder, for a start.sh run from its verified copy


def start_kit(kit: str | Path, expected_key: str | None, party: str | None = None,
              args: list[str] | None = None) -> int:
    """Verify the kit completely, then run its ``start.sh`` from the verified bytes (see the module docstring).

    Args:
        kit: the kit folder.
        expected_key: ``spki-sha256:…`` or a public key file, obtained out of band.
        party: this host's party (a kit of another party is refused).
        args: passed to the script (and by it to ``party serve`` / ``split train``).

    Returns:
        The script's exit code.

    Raises:
        KitError / KitVersionError: the kit must not start; nothing in it was run.
    """
    kit = Path(kit).resolve()
    if not expected_key:
        raise KitError(f"kit {kit}: give the consortium key to check it against (--consortium-key spki-sha256:… or "
                       f"{ENV_KEY}), as the provisioner told you out of band; a kit is never started unverified")
    m = verify_kit(kit, expected_key, party)
    check_kit_version(kit, m, record=False)
    want = m.files.get("start.sh")
    if want is None:
        raise KitError(f"kit {kit}: its manifest lists no start.sh")
    script = (kit / "start.sh").read_bytes()
    if not hmac.compare_digest("sha256:" + hashlib.sha256(script).hexdigest(), want):
        raise KitError(f"kit {kit}: file start.sh was changed after it was verified; not run")
    with tempfile.TemporaryDirectory(prefix="modelward-start-") as tmp:
        copy = Path(tmp) / "start.sh"
        fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
        with os.fdopen(fd, "wb") as f:
            f.write(script)
        env = {**os.environ, ENV_KEY: expected_key, KIT_DIR_ENV: str(kit), **({ENV_PARTY: party} if party else {})}
        return subprocess.call(["/bin/sh", str(copy), *(args or [])], cwd=kit, env=env)
