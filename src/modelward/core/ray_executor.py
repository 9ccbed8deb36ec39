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

Local use (``address=None``) starts a private Ray instance on this machine bound to 127.0.0.1 with `workers` CPUs;
``address="auto"`` or ``"HOST:PORT"`` joins an existing cluster, whose nodes must have modelward (and the data
files, at the same paths) installed — see docs/scale.md.

Example:
    >>> from modelward.core.runner import run_plan
    >>> run_plan(ledger, plan, execute, executor=RayExecutor(workers=2))  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
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
