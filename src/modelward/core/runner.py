"""The one executor of a study's runs over the SQLite ledger (dependencies, workers, resume, exactly-once).

A study is a *plan*: a list of :class:`RunSpec` (a stable ``run_id``, a JSON-able ``spec``, the ids it depends on,
and the resources it needs). :func:`run_plan` registers the plan in a :class:`~modelward.core.ledger.RunLedger`,
then runs every run that is not done yet, each once its dependencies are done, and returns a
:class:`RunOutcome`::

    plan = [RunSpec("orig|0", {"seed": 0}),
            RunSpec("re|0|fc1", {"seed": 0, "part": "fc1"}, depends_on=("orig|0",))]
    outcome = run_plan(RunLedger(out / "ledger.sqlite"), plan, execute, workers=2)

``execute(run_id, spec, dep_results) -> dict`` does one run; ``dep_results`` maps each dependency's id to its
recorded result. It must be picklable (a module-level function, or ``functools.partial`` of one with picklable
arguments) because executors may run it in another process or on another machine, and it must return a JSON-able
dict (the result the ledger records). It may write files (curves, checkpoints) into the study folder.

Guarantees
----------
- **Exactly once.** Before a run is handed to an executor the driver *claims* it in the ledger (an atomic
  ``pending -> running`` update, :meth:`RunLedger.start`); the result is recorded by the driver with the
  idempotent :meth:`RunLedger.finish` in the same transaction that marks it done. A run that is done is never
  executed again; a run is never recorded twice.
- **Resume.** Ctrl-C, ``kill -9`` or a crash leaves claimed runs ``running``; the next ``run_plan`` on the same
  ledger first puts them back to ``pending`` (:meth:`RunLedger.recover`) and runs them again. To make that safe
  the driver holds :class:`~modelward.core.lock.FolderLock` ``(ledger folder, "runner")`` while it runs: a
  second driver on the same folder fails at once with ``LockedError`` naming the first.
- **Failures.** A run that raises is recorded ``failed`` (with its traceback) and retried on the next call; the
  other runs go on (``fail_fast=True`` re-raises the first failure instead). A run whose dependency failed is not
  started and is reported as *blocked*. Both appear in ``RunOutcome.failed`` (blocked ones also in
  ``RunOutcome.blocked``).
- **Order.** Among runs that are ready, those other runs depend on go first (they unlock parallel work), then plan
  order.

Executors
---------
An :class:`Executor` is the small interface a backend implements; the runner never needs more:

- ``slots(resources) -> int``: how many runs to keep in flight (a local pool: its worker count; a cluster: as
  many as the plan has — the cluster's own scheduler then queues them by their ``resources``).
- ``submit(fn, *args, resources) -> handle``: start ``fn(*args)`` somewhere; ``resources`` is a
  :class:`Resources` (cpus, gpus) taken from the run's :class:`RunSpec`.
- ``wait_any(handles) -> list[handle]``: block until at least one of `handles` is finished; return the finished
  ones.
- ``result(handle)``: the return value, or raise the exception the call raised.
- ``shutdown(cancel=False)``: release the workers (cancel what has not started when ``cancel``).

Built in: ``"sequential"`` (:class:`SequentialExecutor`, in this process), ``"process"``
(:class:`ProcessPoolExecutor`, spawned worker processes with one torch thread each) and ``"local"`` (sequential for
``workers=1``, else the process pool). A new backend (e.g. Ray: ``submit`` = ``ray.remote(fn).options(num_cpus=...,
num_gpus=...).remote(*args)``, ``wait_any`` = ``ray.wait(handles, num_returns=1)``, ``result`` = ``ray.get``) is
added by registering it — ``EXECUTORS.add("ray", "modelward.scale.ray:RayExecutor")`` — or by passing an instance
as ``executor=``; no study code changes. Executors run only ``execute``: the ledger is touched by the driver alone,
so workers need not see the SQLite file.
"""

from __future__ import annotations

import os
import traceback
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent import futures
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

from modelward.core.ledger import RunLedger
from modelward.core.lock import FolderLock
from modelward.core.progress import ProgressSink, as_sink
from modelward.core.registry import Registry
from modelward.errors import ConfigError, ModelwardError

Execute = Callable[[str, dict[str, Any], dict[str, dict[str, Any]]], dict[str, Any]]


class DamagedDependency(ModelwardError):
    """Raised by ``execute`` when the output of a finished dependency (e.g. the original model's checkpoint) is
    missing or damaged: the runner re-opens that dependency and runs it again, then the run that needed it.

    Args:
        dependency: the run id whose output is damaged.
        problem: what is wrong with it (one line, naming the file).
    """

    def __init__(self, dependency: str, problem: str) -> None:
        super().__init__(dependency, problem)
        self.dependency, self.problem = dependency, problem

    def __str__(self) -> str:
        return f"the output of run {self.dependency!r} is damaged ({self.problem})"


@dataclass(frozen=True)
class Resources:
    """What one run needs from an executor (cluster executors schedule by it; local ones by slot count)."""

    cpus: float = 1.0
    gpus: float = 0.0


@dataclass(frozen=True)
class RunSpec:
    """One run of a plan.

    Args:
        run_id: stable, unique id (the ledger key; re-planning the same study must give the same ids).
        spec: JSON-able description of the run, recorded in the ledger and passed to ``execute``.
        depends_on: ids of runs that must be done first (their results are passed to ``execute``).
        cpus, gpus: resources the run needs (used by cluster executors).
    """

    run_id: str
    spec: dict[str, Any]
    depends_on: tuple[str, ...] = ()
    cpus: float = 1
    gpus: float = 0

    @property
    def resources(self) -> Resources:
        return Resources(float(self.cpus), float(self.gpus))


@dataclass
class RunOutcome:
    """What :func:`run_plan` achieved: ``done`` of ``total`` runs are done (including earlier calls);
    ``failed`` maps each failed or blocked run to its error; ``blocked`` lists the runs not started because a
    dependency failed."""

    done: int
    total: int
    failed: dict[str, str] = field(default_factory=dict)
    blocked: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.done == self.total


# -- executors ------------------------------------------------------------------------------------------------
class Executor(ABC):
    """Where runs execute (see the module docstring for the contract)."""

    @abstractmethod
    def slots(self, resources: Sequence[Resources]) -> int:
        """How many runs to keep in flight at once, given the resources of the runs still to go."""

    @abstractmethod
    def submit(self, fn: Callable[..., Any], *args: Any, resources: Resources) -> Any:
        """Start ``fn(*args)``; returns a handle."""

    @abstractmethod
    def wait_any(self, handles: Sequence[Any]) -> list[Any]:
        """Block until at least one handle is finished; return the finished ones."""

    @abstractmethod
    def result(self, handle: Any) -> Any:
        """The call's return value (or raise its exception)."""

    def shutdown(self, cancel: bool = False) -> None:  # noqa: B027 - optional for executors without workers
        """Release resources; `cancel` drops work not yet started."""


class _Done:
    """The handle of a call the sequential executor already made."""

    __slots__ = ("value", "error")

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error


class SequentialExecutor(Executor):
    """Runs each call in this process, at submit time (one at a time). Exceptions other than ``Exception``
    subclasses (Ctrl-C) propagate at once; others are kept for :meth:`result`."""

    def slots(self, resources: Sequence[Resources]) -> int:
        return 1

    def submit(self, fn: Callable[..., Any], *args: Any, resources: Resources) -> _Done:
        try:
            return _Done(fn(*args))
        except Exception as e:
            return _Done(error=e)

    def wait_any(self, handles: Sequence[Any]) -> list[Any]:
        return list(handles)

    def result(self, handle: _Done) -> Any:
        if handle.error is not None:
            raise handle.error
        return handle.value


def die_with_parent(parent: int, poll_s: float = 1.0) -> str:
    """Make this process die when `parent` does (a worker must never outlive its driver: it would finish its run
    and write into the study folder without the driver's lock, then idle forever).

    On Linux the kernel sends SIGKILL when the parent dies (``prctl(PR_SET_PDEATHSIG)``); everywhere a daemon
    thread also checks every `poll_s` seconds that the parent is still ours (``os.getppid()``) and exits if not.

    Args:
        parent: the driver's pid (``os.getpid()`` in the driver).
        poll_s: the watchdog's period.

    Returns:
        ``"pdeathsig"`` or ``"watchdog"``: what guards the process (the watchdog runs in both cases).

    Example:
        >>> die_with_parent(os.getppid()) in ("pdeathsig", "watchdog")  # doctest: +SKIP
        True
    """
    import signal
    import sys
    import threading
    import time

    how = "watchdog"
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) == 0:  # 1 = PR_SET_PDEATHSIG
                how = "pdeathsig"
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="die-with-driver", daemon=True).start()
    return how


def _worker_init(parent: int | None = None) -> None:
    # one torch thread per worker: W workers share the machine's cores instead of oversubscribing them. Set through
    # the environment so that a worker that never needs torch does not pay for importing it.
    import sys

    if parent is not None:
        die_with_parent(parent)
    os.environ["MODELWARD_WORKER"] = "1"
    os.environ["OMP_NUM_THREADS"] = "1"
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


class ProcessPoolExecutor(Executor):
    """A pool of `workers` spawned processes on this machine (``spawn``: no state inherited from the driver).

    A worker that dies (``kill -9``, out of memory) fails the runs it was running; the pool is then replaced
    and the remaining runs go on. A driver that dies takes its workers with it (:func:`die_with_parent`).
    """

    def __init__(self, workers: int | None = None) -> None:
        from multiprocessing import get_context

        self.workers = max(1, workers or os.cpu_count() or 1)
        self._context = get_context("spawn")
        self._pool = self._new_pool()

    def _new_pool(self) -> futures.ProcessPoolExecutor:
        return futures.ProcessPoolExecutor(max_workers=self.workers, mp_context=self._context,
                                           initializer=_worker_init, initargs=(os.getpid(),))

    def slots(self, resources: Sequence[Resources]) -> int:
        return self.workers

    def submit(self, fn: Callable[..., Any], *args: Any, resources: Resources) -> futures.Future[Any]:
        try:
            return self._pool.submit(fn, *args)
        except BrokenProcessPool:
            # a worker died (kill -9, out of memory): its runs were reported failed; carry on with a fresh pool
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = self._new_pool()
            return self._pool.submit(fn, *args)

    def wait_any(self, handles: Sequence[Any]) -> list[Any]:
        finished, _ = futures.wait(handles, return_when=futures.FIRST_COMPLETED)
        return [h for h in handles if h in finished]

    def result(self, handle: futures.Future[Any]) -> Any:
        return handle.result()

    def shutdown(self, cancel: bool = False) -> None:
        self._pool.shutdown(wait=not cancel, cancel_futures=cancel)


EXECUTORS = Registry("executor")
EXECUTORS.add("sequential", "modelward.core.runner:SequentialExecutor")
EXECUTORS.add("process", "modelward.core.runner:ProcessPoolExecutor")
EXECUTORS.add("ray", "modelward.core.ray_executor:RayExecutor")  # optional: pip install 'modelward[cluster]'


def make_executor(executor: str | Executor, workers: int = 1, address: str | None = None) -> Executor:
    """An executor instance from a name (``"local"``, ``"sequential"``, ``"process"``, ``"ray"``, registered ones).

    `address` is for cluster executors (``"ray"``: ``None`` = a private local instance, ``"auto"`` or
    ``"HOST:PORT"``); naming it for a local executor is an error rather than silently ignored.
    """
    if isinstance(executor, Executor):
        return executor
    if executor == "local":
        executor = "sequential" if workers <= 1 else "process"
    cls = EXECUTORS.get(executor)
    accepted = EXECUTORS.parameters(executor)
    if address is not None and "address" not in accepted:
        raise ConfigError(f"--address is for cluster executors (ray); executor {executor!r} runs on this machine")
    kwargs: dict[str, Any] = {}
    if "workers" in accepted and cls is not SequentialExecutor:
        kwargs["workers"] = workers
    if address is not None:
        kwargs["address"] = address
    return cls(**kwargs)


# -- the plan -------------------------------------------------------------------------------------------------
def check_plan(plan: Sequence[RunSpec], done: set[str] | None = None) -> None:
    """Refuse duplicate ids, unknown dependencies (unless already done in the ledger) and cycles."""
    ids = [r.run_id for r in plan]
    dup = sorted(i for i, n in Counter(ids).items() if n > 1)
    if dup:
        raise ConfigError(f"run plan: duplicate run ids {dup[:5]}")
    in_plan = set(ids)
    known = in_plan | (done or set())
    for r in plan:
        bad = [d for d in r.depends_on if d not in known]
        if bad:
            raise ConfigError(f"run plan: {r.run_id!r} depends on unknown run(s) {bad}")
    deps = {r.run_id: [d for d in r.depends_on if d in in_plan] for r in plan}
    state: dict[str, int] = {}  # 1 = visiting, 2 = finished

    for root in ids:
        stack = [(root, iter(deps[root]))]
        if state.get(root) == 2:
            continue
        state[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                raise ConfigError(f"run plan: dependency cycle through {nxt!r}")
            elif state.get(nxt) != 2:
                state[nxt] = 1
                stack.append((nxt, iter(deps[nxt])))


def _error_text(e: BaseException) -> str:
    return str(e) if isinstance(e, ModelwardError) else f"{type(e).__name__}: {e}"


def _call(execute: Execute, run_id: str, spec: dict[str, Any], dep_results: dict[str, dict[str, Any]]) -> Any:
    """What executors run: ``execute`` itself (module level, so it pickles by reference)."""
    return execute(run_id, spec, dep_results)


def run_plan(ledger: RunLedger, plan: list[RunSpec], execute: Execute, *, workers: int = 1,
             executor: str | Executor = "local", progress: ProgressSink | None = None,
             on_result: Callable[[str, dict[str, Any]], str | None] | None = None, description: str = "runs",
             fail_fast: bool = False, lock: bool = True, address: str | None = None) -> RunOutcome:
    """Run (or resume) every run of `plan` that the ledger does not have as done.

    Args:
        ledger: the study's ledger (the plan is registered in it; a run id re-planned with another spec fails).
        plan: the runs (see :class:`RunSpec`).
        execute: ``execute(run_id, spec, dep_results) -> dict``, picklable (see the module docstring).
        workers: parallel runs for the ``"local"`` executor (1 = in this process).
        executor: ``"local"`` | ``"sequential"`` | ``"process"`` | a registered name | an :class:`Executor`.
        progress: receives ``start/advance/done`` for key `description` (one unit per run).
        on_result: called in the driver after each run is recorded, as ``on_result(run_id, result)``; a string
            it returns becomes the progress line (e.g. a running estimate).
        description: the progress key / label.
        fail_fast: re-raise the first failing run's exception (after recording it) instead of going on.
        lock: hold the folder's ``"runner"`` :class:`FolderLock` while running (one driver per ledger).
        address: for cluster executors (``executor="ray"``): ``"auto"``/``"HOST:PORT"`` of a running cluster.

    Returns:
        :class:`RunOutcome`.

    Raises:
        ConfigError: a malformed plan (duplicate ids, unknown dependencies, a cycle).
        LockedError: another driver is running this ledger.
        KeyboardInterrupt: re-raised after cancelling; claimed runs are resumed by the next call.
    """
    sink = as_sink(progress)
    guard = FolderLock(ledger.path.parent, "runner") if lock else None
    if guard is not None:
        guard.acquire()
    try:
        return _run(ledger, plan, execute, workers, executor, sink, on_result, description, fail_fast, address)
    finally:
        if guard is not None:
            guard.release()


def _run(ledger: RunLedger, plan: list[RunSpec], execute: Execute, workers: int, executor: str | Executor,
         sink: ProgressSink, on_result: Callable[[str, dict[str, Any]], str | None] | None, description: str,
         fail_fast: bool, address: str | None = None) -> RunOutcome:
    results = ledger.results()
    check_plan(plan, set(results))
    for r in plan:
        ledger.add(r.run_id, r.spec)
    ledger.recover()
    results = ledger.results()
    by_id = {r.run_id: r for r in plan}
    order = {r.run_id: i for i, r in enumerate(plan)}
    has_dependents = {d for r in plan for d in r.depends_on}
    pending = [r.run_id for r in plan if r.run_id not in results]
    total = len(plan)
    sink.start(description, total, description)
    already = total - len(pending)
    if already:
        sink.advance(description, already)
    failed: dict[str, str] = {}
    blocked: list[str] = []
    reopened: set[str] = set()  # dependencies whose damaged output is being re-created in this call
    if not pending:
        sink.done(description)
        return RunOutcome(total, total)

    def ready_runs() -> list[str]:
        out = [rid for rid in pending if all(d in results for d in by_id[rid].depends_on)]
        return sorted(out, key=lambda rid: (rid not in has_dependents, order[rid]))

    def propagate_blocked() -> None:
        changed = True
        while changed:
            changed = False
            for rid in list(pending):
                bad = [d for d in by_id[rid].depends_on if d in failed]
                if bad:
                    pending.remove(rid)
                    failed[rid] = f"blocked: its dependency {bad[0]!r} failed"
                    blocked.append(rid)
                    changed = True

    ex = make_executor(executor, workers, address)  # only now: a cluster is not started when nothing is pending
    running: dict[Any, str] = {}
    try:
        while True:
            propagate_blocked()
            room = ex.slots([by_id[r].resources for r in pending]) - len(running)
            for rid in ready_runs()[: max(0, room)]:
                pending.remove(rid)
                if not ledger.start(rid):  # done or claimed meanwhile: never run twice
                    if ledger.status(rid) == "done":
                        results[rid] = ledger.results()[rid]
                        sink.advance(description, 1, rid)
                    continue
                spec = by_id[rid]
                deps = {d: results[d] for d in spec.depends_on}
                try:
                    running[ex.submit(_call, execute, rid, spec.spec, deps, resources=spec.resources)] = rid
                except Exception as e:  # the executor itself failed (e.g. a broken pool)
                    _record_failure(ledger, rid, e, failed)
                    if fail_fast:
                        raise
            if not running:
                if not ready_runs():
                    break
                continue
            for handle in ex.wait_any(list(running)):
                rid = running.pop(handle)
                try:
                    result = ex.result(handle)
                    if not isinstance(result, dict):
                        raise ModelwardError(f"run {rid!r}: execute returned {type(result).__name__}, not a dict")
                    ledger.finish(rid, result)
                except DamagedDependency as e:
                    if _recreate(ledger, e, rid, by_id, results, pending, reopened):
                        sink.advance(description, 0, f"{e.dependency}: its output is damaged, re-creating it")
                        continue
                    _record_failure(ledger, rid, e, failed)
                    if fail_fast:
                        raise
                    continue
                except Exception as e:
                    _record_failure(ledger, rid, e, failed)
                    sink.advance(description, 0, f"{rid}: failed")
                    if fail_fast:
                        raise
                    continue
                results[rid] = result
                info = on_result(rid, result) if on_result is not None else None
                sink.advance(description, 1, info if info is not None else rid)
    except BaseException:
        ex.shutdown(cancel=True)
        raise
    ex.shutdown()
    propagate_blocked()
    sink.done(description)
    done = sum(1 for r in plan if r.run_id in results)
    return RunOutcome(done, total, failed, blocked)


def _recreate(ledger: RunLedger, e: DamagedDependency, rid: str, by_id: dict[str, RunSpec],
              results: dict[str, dict[str, Any]], pending: list[str], reopened: set[str]) -> bool:
    """Re-open the damaged dependency (once per call) and queue it and `rid` again; False if it cannot be."""
    dep = e.dependency
    if dep not in by_id or dep not in by_id[rid].depends_on:
        return False
    if dep in reopened and dep in results:  # re-created in this call and damaged again: report it as it is
        e.problem += "; it was re-created in this run and is still damaged"
        return False
    if dep not in reopened:
        reopened.add(dep)
        ledger.reopen(dep)
        results.pop(dep, None)
        if dep not in pending:
            pending.append(dep)
    ledger.reopen(rid)
    pending.append(rid)
    return True


def _record_failure(ledger: RunLedger, rid: str, e: BaseException, failed: dict[str, str]) -> None:
    ledger.fail(rid, "".join(traceback.format_exception(e)))
    failed[rid] = _error_text(e)
