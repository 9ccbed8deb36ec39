import json
import os
import signal
import subprocess
import sys
import time

import pytest

from modelward.core.lock import FolderLock, LockedError

HOLD = """
import sys, time
from modelward.core.lock import FolderLock
lock = FolderLock(sys.argv[1], "study").acquire()
print("locked", flush=True)
time.sleep(60)
"""


def test_second_writer_is_refused_with_the_holder_named(tmp_path) -> None:
    with FolderLock(tmp_path, "study") as first:
        assert first.held
        with pytest.raises(LockedError, match=rf"pid {os.getpid()} on host") as e:
            FolderLock(tmp_path, "study").acquire()
        assert e.value.holder["pid"] == os.getpid()
        with FolderLock(tmp_path, "guard"):  # another kind of writer is independent
            pass
    assert not (tmp_path / ".study.lock").exists()
    with FolderLock(tmp_path, "study"):  # released: free again
        pass


def test_stale_lock_file_of_a_dead_process_is_taken_over(tmp_path) -> None:
    (tmp_path / ".study.lock").write_text(json.dumps({"pid": 999999, "host": "x", "started": 0}))
    with FolderLock(tmp_path, "study"):
        assert json.loads((tmp_path / ".study.lock").read_text())["pid"] == os.getpid()


def test_lock_of_a_killed_process_is_free(tmp_path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        with pytest.raises(LockedError, match=f"pid {proc.pid}"):
            FolderLock(tmp_path, "study").acquire()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    deadline = time.time() + 5
    while True:
        try:
            with FolderLock(tmp_path, "study"):
                break
        except LockedError:
            if time.time() > deadline:
                raise
            time.sleep(0.05)
