"""Helpers for the server subprocesses modelward starts on 127.0.0.1 (party servers, the guarded API)."""

from __future__ import annotations

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
