"""A killed Ray driver leaves nothing behind (issue 31 item 4): the private Ray instance a study started (GCS,
raylet, agents, workers) goes with the driver, even on kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytestmark = pytest.mark.xdist_group("ray")  # one Ray instance at a time: two would thrash a small machine

DRIVER = """
import sys, time
from functools import partial
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from test_ray_driver_exit import slow
from modelward.core.ledger import RunLedger
from modelward.core.ray_executor import RayExecutor
from modelward.core.runner import RunSpec, run_plan
tmp = Path(sys.argv[1])
ex = RayExecutor(workers=1)
(tmp / "session").write_text(ex.session_dir or "")
run_plan(RunLedger(tmp / "ledger.sqlite"), [RunSpec("r", {})], partial(slow, str(tmp)), executor=ex)
"""


def slow(folder: str, run_id: str, spec: dict, deps: dict) -> dict:
    Path(folder, "running").write_text(str(os.getpid()))
    time.sleep(120)
    return {}


def _ray_processes(session: str) -> list[int]:
    """Processes whose command line names this Ray session (its folder or its name)."""
    name = Path(session).name
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "stat").read_text().split(") ")[-1][0]
        except OSError:
            continue
        if state != "Z" and (session in cmd or name in cmd):
            out.append(int(d.name))
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_kill_9_of_a_ray_driver_takes_its_private_ray_instance_with_it(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent),
                                                        str(Path(__file__).resolve().parents[2] / "src")])}
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path), str(Path(__file__).parent)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    session = ""
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / "running").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the run did not start"
            time.sleep(0.1)
        session = (tmp_path / "session").read_text()
        assert session and _ray_processes(session)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    deadline = time.monotonic() + 30
    while _ray_processes(session) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _ray_processes(session)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f"Ray processes of {session} outlived the driver: {left}"
