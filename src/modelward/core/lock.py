"""One writer per folder: an exclusive lock on an output folder (a study, a guard service's state, a party).

``FolderLock(folder, what)`` holds ``folder/.<what>.lock`` for the duration of a ``with`` block. The file
records who holds it (pid, host, start time) so that a refused second writer can say who is in the way.

Mechanism: an ``fcntl.flock`` on the lock file. The kernel drops it when the holder exits in any way (Ctrl-C,
``kill -9``, a crash), so a *stale* lock file left by a dead process is simply taken over; a live holder — in
this process or another — makes the second acquisition fail at once with :class:`LockedError` naming it. (On
network file systems Linux maps ``flock`` to POSIX byte-range locks, so holders on other hosts are seen too.)
The descriptor is not inherited by exec'd child processes (PEP 446).

Example:
    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> with FolderLock(d, "study"):
    ...     pass
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from modelward.errors import ModelwardError


class LockedError(ModelwardError):
    """Another live process (named in the message and in ``holder``) is writing to the folder."""

    def __init__(self, message: str, holder: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.holder = holder or {}


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "another process (no details recorded yet)"
    started = holder.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)) if isinstance(started, (int, float)) else "?"
    return f"pid {holder.get('pid')} on host {holder.get('host')} (since {when})"


class FolderLock:
    """Exclusive lock of `folder` for one kind of writer.

    Args:
        folder: the folder to protect (created if missing).
        what: which writer this is ("study", "guard", "party", ...); locks with different `what` are independent,
            and it names the lock file ``.<what>.lock``.

    Raises:
        LockedError: on entry, when a live process holds the same lock (the message names pid, host, start).
    """

    def __init__(self, folder: str | Path, what: str = "study") -> None:
        self.folder = Path(folder)
        self.what = what
        self.path = self.folder / f".{what}.lock"
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def holder(self) -> dict[str, Any]:
        """What the lock file says about its holder ({} if unreadable)."""
        try:
            return dict(json.loads(self.path.read_text()))
        except (OSError, ValueError, TypeError):
            return {}

    def acquire(self) -> FolderLock:
        if self._fd is not None:
            raise LockedError(f"{self.path}: this FolderLock is already held")
        self.folder.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                holder = self.holder()
                raise LockedError(f"{self.folder}: another {self.what} writer is using this folder: "
                                  f"{_describe(holder)}. Wait for it to finish or stop it, or use another folder.",
                                  holder) from None
            # the file may have been unlinked by a releasing holder between our open and flock: retry on the new one
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "what": self.what}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(fd)  # closing drops the flock

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
