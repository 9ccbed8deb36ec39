"""Helpers for the server subprocesses modelward starts on 127.0.0.1 (party servers, the guarded API)."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_gracefully(proc: subprocess.Popen, timeout: float) -> int:
    """SIGTERM (servers save their state and close their logs on it), then SIGKILL after `timeout` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return int(proc.returncode)


_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3  # glibc <malloc.h>


def keep_freed_memory(mmap_threshold_mb: int = 32, trim_threshold_mb: int = 128) -> bool:
    """Let this process reuse the memory it frees instead of handing it back to the OS (glibc ``mallopt``).

    By default glibc serves every block of 128 KiB or more (message buffers, activations, gradients) by a fresh
    ``mmap`` and unmaps it on ``free``, so a server that handles one 512 KiB tensor after another page-faults
    every page of every buffer back in: 120–300 minor faults per split-training step in a party server (up to
    ~1.5 ms of kernel time). With blocks below `mmap_threshold_mb` taken from the heap and up to `trim_threshold_mb` of
    free heap kept, the same steps fault ~20 times. Process-wide; meant for long-running server processes
    (``party serve``, ``split train``). Plain single-process training was measured unaffected.

    Args:
        mmap_threshold_mb: blocks at least this large still get their own mapping.
        trim_threshold_mb: free memory at the top of the heap kept for reuse before it is returned.

    Returns:
        True if applied; False where the C library is not glibc (nothing changes then).

    Example:
        >>> keep_freed_memory() in (True, False)
        True
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mb = 2**20
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold_mb * mb) and mallopt(_M_TRIM_THRESHOLD, trim_threshold_mb * mb)
                and mallopt(_M_TOP_PAD, 16 * mb))


def idle_priority() -> bool:
    """Run the calling thread at the lowest CPU priority: Linux ``SCHED_IDLE`` (it gets a CPU ahead of nothing
    else, so it never delays the other threads of this host; under full load it still progresses, slowly).

    Meant for work with slack, such as a party's late update, which runs while the other parties work and is only
    needed by the next request. A thread cannot raise its priority again without privileges.

    Returns:
        True if applied; False where the OS has no such policy or refuses it (nothing changes then).

    Example:
        >>> import threading
        >>> t = threading.Thread(target=idle_priority); t.start(); t.join()
    """
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: the calling thread (Linux)
    except (AttributeError, OSError):
        return False
    return True
