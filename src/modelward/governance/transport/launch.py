"""Start party servers as subprocesses on this machine (demo, benchmark, tests) and write their TOML configs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from modelward.core.process import stop_gracefully
from modelward.errors import ModelwardError


class LaunchError(ModelwardError):
    """A party server did not start; the message quotes the end of its log."""


@dataclass
class PartyProcess:
    name: str
    proc: subprocess.Popen
    log: Path
    port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM (graceful: the party saves a checkpoint and closes its audit log), then wait."""
        return stop_gracefully(self.proc, timeout)

    def kill(self) -> None:
        """SIGKILL: a crash, no chance to clean up."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def spawn_party(config: Path, log: Path, overrides: list[str] | None = None,
                env: dict[str, str] | None = None) -> tuple[subprocess.Popen, int]:
    """Run `modelward party serve CONFIG` in a subprocess, output appended to `log`; returns (process, log offset)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "modelward.cli.party", "serve", str(config)]
    for o in overrides or []:
        cmd += ["--set", o]
    with log.open("ab") as fh:
        start = fh.tell()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    return proc, start


def wait_ready(proc: subprocess.Popen, config: Path, log: Path, start: int, timeout: float = 90.0) -> PartyProcess:
    """Wait for the server's READY line (which carries its port)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_bytes()[start:].decode("utf-8", "replace")
        for line in text.splitlines():
            if line.startswith("READY "):
                _, name, addr = line.split()
                return PartyProcess(name, proc, log, int(addr.rsplit(":", 1)[1]))
        if proc.poll() is not None:
            raise LaunchError(f"party server {config} exited with code {proc.returncode}:\n{text[-2000:]}")
        time.sleep(0.1)
    proc.kill()
    raise LaunchError(f"party server {config} did not become ready within {timeout:.0f}s; see {log}")


def start_party(config: Path, log: Path, overrides: list[str] | None = None, timeout: float = 90.0,
                env: dict[str, str] | None = None) -> PartyProcess:
    proc, start = spawn_party(config, log, overrides, env)
    return wait_ready(proc, config, log, start, timeout)


def start_parties(configs: dict[str, Path], logs: dict[str, Path], timeout: float = 90.0) -> dict[str, PartyProcess]:
    """Start several servers at once (they load in parallel), then wait for all of them."""
    spawned = {n: spawn_party(configs[n], logs[n]) for n in configs}
    try:
        return {n: wait_ready(p, configs[n], logs[n], off, timeout) for n, (p, off) in spawned.items()}
    except LaunchError:
        for p, _ in spawned.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        raise


def stop_parties(processes: list[PartyProcess], timeout: float = 20.0) -> None:
    for p in processes:
        if p.proc.poll() is None:
            p.proc.send_signal(signal.SIGTERM)
    for p in processes:
        p.stop(timeout)
