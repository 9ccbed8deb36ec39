"""A killed study driver takes its workers with it (issue 31 item 4): none finishes its run or writes afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

DRIVER = """
import sys
from functools import partial
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from test_runner_orphans import slow
from modelward.core.ledger import RunLedger
from modelward.core.runner import RunSpec, run_plan
tmp = Path(sys.argv[1])
plan = [RunSpec(f"r{i}", {"i": i}) for i in range(2)]
run_plan(RunLedger(tmp / "ledger.sqlite"), plan, partial(slow, str(tmp)), workers=2, executor="process")
"""


def slow(folder: str, run_id: str, spec: dict, deps: dict) -> dict:
    """Announces its pid, then 'trains' for 20 s and writes a result file (what an orphan would write)."""
    Path(folder, f"{run_id}.pid").write_text(str(os.getpid()))
    time.sleep(20)
    Path(folder, f"{run_id}.written").write_text("written after the driver died")
    return {"pid": os.getpid()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (dead, not yet reaped by its new parent) counts as dead
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


def test_kill_9_of_the_driver_kills_its_workers(tmp_path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path), str(Path(__file__).parent)])
    try:
        deadline = time.monotonic() + 90
        pids = []
        while len(pids) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "the workers did not start"
            pids = [int(p.read_text()) for p in tmp_path.glob("*.pid") if p.read_text()]
            time.sleep(0.05)
        assert all(_alive(p) for p in pids)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    deadline = time.monotonic() + 10  # the watchdog's period is 1 s; the kernel's signal is immediate
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in pids if _alive(p)]
    for p in left:  # never leave them behind, even when the test fails
        os.kill(p, signal.SIGKILL)
    assert not left, f"workers {left} outlived their driver"
    assert not list(tmp_path.glob("*.written"))
