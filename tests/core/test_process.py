"""Process helpers: a server process that reuses the memory it frees."""

import subprocess
import sys

import pytest

_FAULTS = """
import resource, sys, torch
from modelward.core.process import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "on" else None
for _ in range(5):  # warm: the heap has grown to what one round needs
    bufs = [bytearray(512 * 1024) for _ in range(4)]; del bufs
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):  # what a party server does per step: fresh message buffers, freed after the answer
    bufs = [bytearray(512 * 1024) for _ in range(4)]; del bufs
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    applied, faults = out.stdout.split()
    return applied, int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_freed_buffers_are_reused_instead_of_faulted_back_in():
    applied, with_it = _faults("on")
    if applied != "True":
        pytest.skip("not glibc")
    assert with_it < 100, with_it  # 50 rounds x 4 buffers x 128 pages: reused, not faulted in again
    _, without = _faults("off")
    if without < 100:  # some platforms keep them anyway (Python 3.12 on Linux 6.18: 0 faults either way)
        pytest.skip(f"this platform reuses freed buffers without the setting as well ({without} faults), so the "
                    "difference it makes cannot be shown here")
    assert with_it < without, (with_it, without)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_IDLE is Linux's")
def test_idle_priority_lowers_only_the_calling_thread():
    import os
    import threading

    from modelward.core.process import idle_priority

    seen = {}

    def worker():
        seen["applied"] = idle_priority()
        seen["policy"] = os.sched_getscheduler(0)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == {"applied": True, "policy": os.SCHED_IDLE}
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # this thread keeps its priority
