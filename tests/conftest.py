"""Suite-wide settings: hypothesis is derandomized (the same examples every run) so CI is reproducible; set
HYPOTHESIS_PROFILE=dev for fresh random examples while developing. Every test starts from the same global random
state (torch, NumPy, random): since torch 2.13 an unseeded process draws a fresh seed, so a test that forgets to
seed would otherwise see different numbers in every run.

``MODELWARD_TEST_SHUFFLE=<seed>`` (or ``=random``) runs the collected tests in a shuffled order: the modules in a
random order and the tests of each module in a random order (a module's tests stay together, so its module-scoped
fixtures start once). The seed is printed in the header; rerun with it to get the same order. Every test must pass
alone and in any order.

``make test`` runs the suite on ``PYTEST_WORKERS`` pytest-xdist workers with ``--dist loadgroup``: the tests of one
module go to one worker (its module-scoped fixtures start once, as in a serial run), and the tests marked
``@pytest.mark.xdist_group(NAME)`` go to one worker together, across modules (the Ray clusters, which would thrash
two at a time on a small machine); the end-to-end modules and the groups are handed out first, the short modules
after them, so that the workers finish together. A shuffled run under xdist shuffles the same way on every worker:
the controller draws the seed before the workers start, and they inherit it through the environment.

Every test starts on the same torch thread count (``MODELWARD_TEST_THREADS``, default 1): a reduction split over
other thread counts rounds differently, and a test's numbers must not depend on what ran or was imported before it.

The numeric tests (``tests/numeric_tests.txt``, marked ``numeric`` here: tolerances, bit-exactness the design
promises, bounds on learned outcomes) run a second time in ``make test`` through another kernel path:
``ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE MODELWARD_TEST_ONEDNN=0`` (ATen's scalar kernels, MKL's
compatible code path, oneDNN off: torch reads no environment variable for oneDNN, so this conftest sets
``torch.backends.mkldnn.enabled``). Exactness is asserted only where the design promises it (the same process and
kernels: resume, rollback, split vs monolithic, pipelined vs sequential); elsewhere a tolerance derived from the
dtype and the computation, with a comment saying which."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

ONEDNN_ENV = "MODELWARD_TEST_ONEDNN"


THREADS_ENV = "MODELWARD_TEST_THREADS"


def _test_threads() -> int:
    raw = os.environ.get(THREADS_ENV, "1").strip()
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise pytest.UsageError(f"{THREADS_ENV}={raw!r}: expected a thread count >= 1")
    return n


def _seed_everything() -> None:
    """The state every test and every module's fixtures start from, whatever ran (or was imported) before."""
    import random

    import numpy as np
    import torch

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    # One torch thread count for every test (MODELWARD_TEST_THREADS, default 1: the box is shared, and one thread
    # is what a test module's import-time torch.set_num_threads(1) left for the whole run anyway). A reduction
    # split over 1 or 2 threads rounds differently, so without this a test's numbers depended on which modules
    # were collected and which test ran before it: tests/governance/test_integrity.py's honest run passed alone
    # (2 threads) and was refused in the suite (1 thread). Calling it from this (the main) thread also aligns the
    # count new threads start with: torch.set_num_threads from a side thread changes only that count (OpenMP keeps
    # one per thread), and the same op then rounded differently here and on a party's threads
    torch.set_num_threads(_test_threads())
    torch.set_default_dtype(torch.float32)
    torch.set_grad_enabled(True)
    if os.environ.get(ONEDNN_ENV, "1").strip() == "0":
        torch.backends.mkldnn.enabled = False


@pytest.fixture(autouse=True)
def _same_global_random_state() -> Iterator[None]:
    _seed_everything()
    # the environment and the working folder as the test found them (after its module's fixtures): a switch one
    # test sets in os.environ (an in-process CLI run's --trust-code, COLUMNS) or a chdir must not reach the next
    environ, cwd = dict(os.environ), os.getcwd()
    yield
    if dict(os.environ) != environ:
        for k in [k for k in os.environ if k not in environ]:
            del os.environ[k]
        os.environ.update({k: v for k, v in environ.items() if os.environ.get(k) != v})
    if os.getcwd() != cwd:
        os.chdir(cwd)


@pytest.fixture(autouse=True, scope="module")
def _same_global_random_state_for_module_fixtures() -> None:
    # module-scoped fixtures start before the per-test seeding above: without this, one that draws from the global
    # RNG sees whatever the previous module's last test left (a split model's default init once did, and its
    # accuracy moved with the test order)
    _seed_everything()


SHUFFLE_ENV = "MODELWARD_TEST_SHUFFLE"


def _shuffle_seed() -> int | None:
    raw = os.environ.get(SHUFFLE_ENV, "").strip()
    if not raw:
        return None
    if raw.lower() == "random":
        import secrets

        seed = secrets.randbelow(2**32)
        os.environ[SHUFFLE_ENV] = str(seed)  # the header and the shuffle see the same seed
        return seed
    try:
        return int(raw)
    except ValueError:
        raise pytest.UsageError(f"{SHUFFLE_ENV}={raw!r}: expected an integer seed or 'random'") from None


NUMERIC_TESTS = Path(__file__).with_name("numeric_tests.txt")


def _numeric_ids() -> tuple[str, ...]:
    return tuple(line.strip() for line in NUMERIC_TESTS.read_text().splitlines() if line.strip())


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "numeric: a numeric test (tests/numeric_tests.txt), run again through a "
                                       "second kernel path by make test")
    # draw a 'random' seed once, here, before pytest-xdist starts its workers: they inherit the environment, so
    # every worker collects the same shuffled order (xdist refuses to run when the workers' collections differ)
    _shuffle_seed()
    _test_threads()  # a bad MODELWARD_TEST_THREADS is a usage error before anything runs
    if os.environ.get(ONEDNN_ENV, "1").strip() == "0":
        # the second kernel path of `make test` (see the Makefile): convolutions and the like through ATen's own
        # kernels instead of oneDNN's. Torch reads no environment variable for this, so the switch is set here, in
        # the test process, and again before every test (processes a test starts keep oneDNN on)
        import torch

        torch.backends.mkldnn.enabled = False


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = []
    seed = _shuffle_seed()
    if seed is not None:
        lines.append(f"shuffled test order: {SHUFFLE_ENV}={seed} (rerun with it to repeat the order)")
    kernel_env = {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", ONEDNN_ENV) if k in os.environ}
    if kernel_env:
        import torch

        lines.append(f"kernel path: {' '.join(f'{k}={v}' for k, v in kernel_env.items())} (torch CPU capability "
                     f"{torch.backends.cpu.get_cpu_capability()}, oneDNN {'on' if torch.backends.mkldnn.enabled else 'off'})")
    return lines


def _shuffle(items: list[pytest.Item], seed: int) -> None:
    """Shuffle modules, then the tests inside each module, in place (deterministic for one seed)."""
    import random

    rng = random.Random(seed)
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    order = list(modules)
    rng.shuffle(order)
    shuffled: list[pytest.Item] = []
    for name in order:
        group = modules[name]
        rng.shuffle(group)
        shuffled.extend(group)
    items[:] = shuffled


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Shuffle the order when asked (``MODELWARD_TEST_SHUFFLE``); mark the numeric tests; tests marked ``gpu`` run
    the main paths on CUDA, and without a CUDA device they are skipped, saying so."""
    seed = _shuffle_seed()
    if seed is not None:
        _shuffle(items, seed)
    numeric = _numeric_ids()
    for item in items:
        if any(item.nodeid == n or item.nodeid.startswith((f"{n}::", f"{n}[")) for n in numeric):
            item.add_marker(pytest.mark.numeric)
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Under ``--dist loadgroup``, a test without an ``xdist_group`` mark is scheduled with the rest of its module
    (plain loadgroup sends each such test on its own, so a module's fixtures would start once per worker)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class ModuleOrGroupScheduling(LoadGroupScheduling):
        heavy_first = False

        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return nodeid.split("::", 1)[0] if scope == nodeid else scope

        def _assign_work_unit(self, node: object) -> None:
            # the long units first (the end-to-end modules and the named groups), the many short ones after them:
            # the short ones then even out the workers' finishing times instead of one long unit ending the run
            if not self.heavy_first:
                self.heavy_first = True
                heavy = [s for s in self.workqueue if s.startswith(HEAVY_TESTS) or not s.startswith("tests/")]
                for scope in reversed(heavy):
                    self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return ModuleOrGroupScheduling(config, log)


HEAVY_TESTS = "tests/e2e/"  # where the long tests live: started first under --dist loadgroup
