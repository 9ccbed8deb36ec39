"""Run a study's runs on a Ray cluster (``--executor ray [--address ADDR]``), behind the runner's Executor interface.

The driver (the process that called :func:`~modelward.core.runner.run_plan`) keeps the ledger: it claims each run
in SQLite, hands it to Ray as a task with the run's resources (``num_cpus``, ``num_gpus``), and records the result
when the task returns. Ray only executes ``execute(run_id, spec, dep_results)``; workers never open the ledger.

What this gives:
- **Exactly once.** A run is recorded by the driver alone, once (``RunLedger.finish`` is idempotent), so a result
  can never be recorded twice. A task is *retried by Ray* only when its worker or node died (``max_retries``,
  system failures only; an exception raised by the run is a failure, recorded and not retried): the dead attempt
  wrote nothing the ledger knows of, and a run's files are written atomically, so the retry replaces any partial
  file. A second driver cannot dispatch the same run (the ledger claim and the folder's runner lock), and on
  Ctrl-C or an error the driver cancels (kills) every task still in flight before it returns, so an interrupted
  run is never still writing when the next ``run_plan`` re-runs it.
- **Resources.** ``RunSpec(cpus=…, gpus=…)`` become Ray's ``num_cpus``/``num_gpus``: GPU runs are placed on GPU
  nodes and each sees only its GPU (``CUDA_VISIBLE_DEVICES``), so ``device = "cuda"`` inside a run is its GPU.
- **No cluster engine of ours.** Queueing, placement, node failure detection and retries are Ray's.

A private instance dies with its driver: :meth:`RayExecutor.shutdown` stops it, and a small reaper process started
beside it kills every process of the instance's session (GCS, raylet, agents, workers) when the driver is gone,
even after ``kill -9`` (on Linux; it reads ``/proc``).

Local use (``address=None``) starts a private Ray instance on this machine bound to 127.0.0.1 with `workers` CPUs;
``address="auto"`` or ``"HOST:PORT"`` joins an existing cluster, whose nodes must have modelward (and the data
files, at the same paths) installed — see docs/scale.md.

Example:
    >>> from modelward.core.runner import run_plan
    >>> run_plan(ledger, plan, execute, executor=RayExecutor(workers=2))  # doctest: +SKIP
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from modelward.core.runner import Executor, Resources
from modelward.errors import ConfigError


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("executor 'ray' needs Ray: pip install 'modelward[cluster]' (or pip install ray)") from None
    return ray


def _run_task(fn: Callable[..., Any], threads: int, *args: Any) -> Any:
    """What a Ray worker executes: one torch thread per CPU the task was given, then the run itself."""
    os.environ["MODELWARD_WORKER"] = "1"
    import torch

    torch.set_num_threads(max(1, threads))
    return fn(*args)


class RayExecutor(Executor):
    """Ray tasks as the runner's executor.

    Args:
        workers: CPUs of the private local instance (``address=None``); ignored when joining a cluster.
        address: ``None`` (start a private local instance), ``"auto"`` or ``"HOST:PORT"`` of a running cluster.
        max_retries: how often Ray re-runs a task whose worker or node died (not for exceptions the run raised).
        in_flight: how many runs to keep submitted at once (default: twice the cluster's CPUs); Ray queues them
            by their resources.
    """

    def __init__(self, workers: int | None = None, address: str | None = None, max_retries: int = 3,
                 in_flight: int | None = None) -> None:
        self.ray = _import_ray()
        self.max_retries = max_retries
        self._started_here = False
        if not self.ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                      "configure_logging": False}
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage reports: nothing leaves the machine
            if address is None:
                # a private instance: keep every Ray socket on the loopback interface
                os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
                kwargs["num_cpus"] = max(1, workers or os.cpu_count() or 1)
            else:
                kwargs["address"] = address
            try:
                self.ray.init(**kwargs)
            except ConnectionError as e:
                raise ConfigError(f"executor 'ray': cannot reach the Ray cluster at {address!r} ({e})") from None
            self._started_here = True
        node = getattr(getattr(getattr(self.ray, "_private", None), "worker", None), "_global_node", None)
        self.session_dir: str | None = node.get_session_dir_path() if node is not None else None
        self._reaper: subprocess.Popen | None = None
        if self._started_here and address is None and self.session_dir and sys.platform.startswith("linux"):
            self._reaper = subprocess.Popen(
                [sys.executable, "-c", "from modelward.core.ray_executor import reap_main; reap_main()",
                 self.session_dir, str(os.getpid())],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)  # not in the driver's process group: Ctrl-C does not stop it first
        cpus = int(self.ray.cluster_resources().get("CPU", 1))
        self.in_flight = in_flight or max(2, 2 * cpus)
        self._remote = self.ray.remote(_run_task)
        self._live: set[Any] = set()

    def slots(self, resources: Sequence[Resources]) -> int:
        return self.in_flight

    def submit(self, fn: Callable[..., Any], *args: Any, resources: Resources) -> Any:
        threads = max(1, int(resources.cpus))
        opts = {"num_cpus": resources.cpus, "num_gpus": resources.gpus, "max_retries": self.max_retries,
                "retry_exceptions": False}
        handle = self._remote.options(**opts).remote(fn, threads, *args)
        self._live.add(handle)
        return handle

    def wait_any(self, handles: Sequence[Any]) -> list[Any]:
        ready, _ = self.ray.wait(list(handles), num_returns=1)
        return ready

    def result(self, handle: Any) -> Any:
        self._live.discard(handle)
        try:
            return self.ray.get(handle)
        except self.ray.exceptions.RayTaskError as e:  # the run raised: surface its own exception
            cause = e.as_instanceof_cause()
            raise cause from None

    def shutdown(self, cancel: bool = False) -> None:
        if cancel:
            for handle in list(self._live):
                try:
                    self.ray.cancel(handle, force=True)
                except Exception:  # noqa: BLE001 - already finished or its node is gone: nothing left to stop
                    pass
            self._live.clear()
        if self._started_here and self.ray.is_initialized():
            self.ray.shutdown()
        if self._reaper is not None:  # sweep what ray.shutdown left (agents), then let the reaper go
            try:
                self._reaper.stdin.close()  # type: ignore[union-attr]
                self._reaper.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self._reaper.kill()
            self._reaper = None


def _proc_table() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, start time, command line) of every live process (Linux ``/proc``)."""
    table: dict[int, tuple[int, str, str]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(") ", 1)[-1].split()
        if fields[0] == "Z":
            continue
        table[int(d.name)] = (int(fields[1]), fields[19], cmd)
    return table


def session_processes(session_dir: str, known: dict[int, str] | None = None) -> dict[int, str]:
    """Processes of one Ray session: those whose command line names it, their descendants, and the `known` ones
    still alive (pid -> start time, so a reused pid is never mistaken for one of them)."""
    me = os.getpid()
    name = Path(session_dir).name
    table = _proc_table()
    found = {pid: start for pid, (_, start, cmd) in table.items()
             if pid != me and (session_dir in cmd or name in cmd)}
    found.update({pid: start for pid, start in (known or {}).items() if table.get(pid, (0, "", ""))[1] == start})
    grew = True
    while grew:  # descendants: workers rename themselves ("ray::IDLE") and no longer name the session
        grew = False
        for pid, (ppid, start, _) in table.items():
            if ppid in found and pid not in found and pid != me:
                found[pid] = start
                grew = True
    return found


def reap_main() -> None:
    """The reaper (``python -c … reap_main() SESSION_DIR DRIVER_PID``): follows the session's processes until its
    stdin closes (the driver shut Ray down, or died), then kills those still alive."""
    import select
    import signal
    import time

    session_dir, driver = sys.argv[1], int(sys.argv[2])
    known: dict[int, str] = {}
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], 1.0)
        if ready and not sys.stdin.buffer.read1(4096):  # EOF: the driver closed the pipe or is dead
            break
        known = session_processes(session_dir, known)
        known.pop(driver, None)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:  # a dying raylet may still start a worker: sweep until none is left
        left = session_processes(session_dir, known)
        left.pop(driver, None)
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        known = left
        time.sleep(0.2)
