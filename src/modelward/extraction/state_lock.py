"""One writer per guard ``state_dir``: a lock file holding the owner's pid, host and start time.

A lock left by a process that no longer runs on this host is stale and taken over; a live holder (or one on
another host, which cannot be checked) makes :class:`FolderLock` raise :class:`LockedError` naming it.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from modelward.errors import ModelwardError


class LockedError(ModelwardError):
    """The folder is in use by another process (the message names it)."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class FolderLock:
    """Context manager: exclusive use of ``folder`` (``what`` names it in messages)."""

    def __init__(self, folder: str | Path, what: str = "folder") -> None:
        self.folder, self.what = Path(folder), what
        self.path = self.folder / ".lock"
        self._held = False

    def __enter__(self) -> FolderLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "time": time.time()}
        for _ in range(20):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder is None:  # being written right now, or garbage: look again
                    time.sleep(0.05)
                    if self._holder() is None and self.path.exists():
                        self.path.unlink(missing_ok=True)
                    continue
                if holder.get("host") == me["host"] and not _alive(int(holder.get("pid", -1))):
                    self.path.unlink(missing_ok=True)  # stale: its process is gone
                    continue
                started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("time", 0))))
                raise LockedError(f"{self.what} {self.folder} is in use by pid {holder.get('pid')} on "
                                  f"{holder.get('host')} (since {started}); stop that process or use another "
                                  f"folder (lock file {self.path})") from None
            with os.fdopen(fd, "w") as fh:
                json.dump(me, fh)
            self._held = True
            return self
        raise LockedError(f"{self.what} {self.folder}: could not take the lock {self.path}")

    def _holder(self) -> dict | None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and "pid" in data else None

    def __exit__(self, *exc: object) -> None:
        if self._held:
            holder = self._holder()
            if holder is not None and holder.get("pid") == os.getpid():
                self.path.unlink(missing_ok=True)
            self._held = False
