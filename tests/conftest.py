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
the controller draws the seed before the workers start, and they inherit it through the environment."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _seed_everything() -> None:
    import random

    import numpy as np
    import torch

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    # torch.set_num_threads from a side thread changes the count new threads start with but not this thread's
    # (OpenMP keeps one per thread): the same op then rounds differently here and on a party's threads. Align
    # them with this thread's count, whatever an earlier test set where
    torch.set_num_threads(torch.get_num_threads())


@pytest.fixture(autouse=True)
def _same_global_random_state() -> None:
    _seed_everything()


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


def pytest_configure(config: pytest.Config) -> None:
    # draw a 'random' seed once, here, before pytest-xdist starts its workers: they inherit the environment, so
    # every worker collects the same shuffled order (xdist refuses to run when the workers' collections differ)
    _shuffle_seed()


def pytest_report_header(config: pytest.Config) -> str | None:
    seed = _shuffle_seed()
    return None if seed is None else f"shuffled test order: {SHUFFLE_ENV}={seed} (rerun with it to repeat the order)"


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
    """Shuffle the order when asked (``MODELWARD_TEST_SHUFFLE``); tests marked ``gpu`` run the main paths on CUDA,
    and without a CUDA device they are skipped, saying so."""
    seed = _shuffle_seed()
    if seed is not None:
        _shuffle(items, seed)
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
