"""The Ray executor on a local multi-node cluster: a node removed mid-study; every run finishes exactly once.

The runs' ``execute`` lives in a module written to a temporary folder that the cluster's workers import (as a
user's code would be installed on every node). It logs each start and each finish, so the test can see that the
node removal really killed a run in flight, that Ray ran it again elsewhere, and that no run finished twice.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.xdist_group("ray")  # one Ray cluster at a time: two would thrash a small machine
cluster_utils = pytest.importorskip("ray.cluster_utils")

TASKS = '''
import os, time

def execute(run_id, spec, deps):
    log = os.path.join(spec["out"], "events.log")
    with open(log, "a") as f:
        f.write(f"start {run_id} {os.getpid()}\\n")
    time.sleep(spec["seconds"])
    value = spec["x"] ** 2 + sum(d["value"] for d in deps.values())
    with open(log, "a") as f:
        f.write(f"finish {run_id} {os.getpid()}\\n")
    return {"value": value}
'''


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    code = tmp_path_factory.mktemp("code")
    (code / "mw_ray_tasks.py").write_text(TASKS)
    old = {k: os.environ.get(k) for k in ("PYTHONPATH", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}
    os.environ["PYTHONPATH"] = os.pathsep.join([str(code), *filter(None, [old["PYTHONPATH"]])])
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # every node on 127.0.0.1
    sys.path.insert(0, str(code))
    c = cluster_utils.Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False,
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 4},
    })
    nodes = [c.add_node(num_cpus=1) for _ in range(2)]
    c.wait_for_nodes()
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    _warm_up()
    yield c, nodes
    ray.shutdown()
    c.shutdown()
    sys.path.remove(str(code))
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_completion_study_on_ray_with_a_node_removed_equals_the_sequential_study(cluster, tmp_path: Path) -> None:  # noqa: ANN001
    """A real study (`modelward.completion`) with `executor="ray"`: a node is removed while the retraining runs are
    in flight (both worker nodes busy); the study still finishes, every run once, and its tables equal the
    sequential run's. (That the removal kills a run, which Ray then runs again, is shown by the next test.)"""
    from modelward.completion.config import StudyConfig
    from modelward.completion.study import run_study
    from modelward.core.data import DataConfig
    from modelward.core.ledger import RunLedger
    from modelward.core.ray_executor import RayExecutor
    from modelward.core.train import TrainConfig
    from modelward.core.zoo import ModelConfig

    c, nodes = cluster
    cfg = StudyConfig(seeds=[0], parts=["fc1", "logits"], procedures=[{"name": "T1", "kind": "T1"}],
                      data=DataConfig(source="digits"), model=ModelConfig(arch="mlp", hidden=[256, 256]),
                      train=TrainConfig(steps=500, eval_every=50, batch_size=32), checkpoint_every=50,
                      early_stop=False)
    seq = run_study(cfg, tmp_path / "seq", workers=1)
    assert seq.done == seq.total

    outcome: dict = {}

    def drive() -> None:
        outcome["res"] = run_study(cfg, tmp_path / "ray", executor=RayExecutor(address=c.address))

    t = threading.Thread(target=drive)
    t.start()
    ckpts = tmp_path / "ray" / "checkpoints"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and t.is_alive() and not list(ckpts.glob("retrain_*.progress.safetensors")):
        time.sleep(0.05)
    in_flight = t.is_alive()
    c.remove_node(nodes.pop(0))  # both worker nodes are busy: one of the two retraining runs dies with its node
    t.join(timeout=180)
    nodes.append(c.add_node(num_cpus=1))  # back to two workers for the next test
    c.wait_for_nodes()
    _warm_up()
    assert not t.is_alive()
    res = outcome["res"]
    assert res.done == res.total and not res.failed
    assert RunLedger(tmp_path / "ray" / "ledger.sqlite").counts()["done"] == res.total
    assert in_flight, "the study finished before the node could be removed"
    assert (tmp_path / "ray" / "hardness.csv").read_text() == (tmp_path / "seq" / "hardness.csv").read_text()


def _warm_up() -> None:
    """Start a worker (with torch imported) on every node, so that runs start together rather than as workers
    come up one by one."""

    @ray.remote(num_cpus=1)
    def warm() -> None:
        import modelward.completion.study  # noqa: F401 - the import is the point
        time.sleep(1.0)

    ray.get([warm.remote() for _ in range(2)])


def _plan(out: Path, seconds: float) -> list:
    from modelward.core.runner import RunSpec

    runs = [RunSpec("root", {"x": 1, "seconds": 0.1, "out": str(out)})]
    runs += [RunSpec(f"leaf{i}", {"x": i, "seconds": seconds, "out": str(out)}, depends_on=("root",))
             for i in range(6)]
    return runs


def test_node_removed_mid_study_every_run_finishes_exactly_once(cluster, tmp_path: Path) -> None:  # noqa: ANN001
    import mw_ray_tasks

    from modelward.core.ledger import RunLedger
    from modelward.core.ray_executor import RayExecutor
    from modelward.core.runner import run_plan

    c, nodes = cluster
    seq_out, ray_out = tmp_path / "seq", tmp_path / "ray"
    seq_out.mkdir()
    ray_out.mkdir()
    seq = run_plan(RunLedger(seq_out / "ledger.sqlite"), _plan(seq_out, 0.0), mw_ray_tasks.execute)
    assert seq.complete

    outcome: dict = {}

    def drive() -> None:
        outcome["res"] = run_plan(RunLedger(ray_out / "ledger.sqlite"), _plan(ray_out, 1.5), mw_ray_tasks.execute,
                                  executor=RayExecutor(address=c.address))

    t = threading.Thread(target=drive)
    t.start()
    log = ray_out / "events.log"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until both nodes are busy with leaves
        text = log.read_text() if log.exists() else ""
        if sum(1 for line in text.splitlines() if line.startswith("start leaf")) >= 2:
            break
        time.sleep(0.1)
    c.remove_node(nodes[1])  # kills its raylet and the run it was executing
    t.join(timeout=120)
    assert not t.is_alive(), "the study did not finish after a node was removed"
    res = outcome["res"]
    assert res.complete and not res.failed

    events = [line.split() for line in log.read_text().splitlines()]
    starts = [rid for kind, rid, _ in events if kind == "start"]
    finishes = [rid for kind, rid, _ in events if kind == "finish"]
    assert sorted(finishes) == sorted(set(finishes)) == sorted(r.run_id for r in _plan(ray_out, 0))
    assert len(starts) > len(finishes), "no run was interrupted by the node removal"
    ledger = RunLedger(ray_out / "ledger.sqlite")
    assert ledger.counts()["done"] == 7
    assert ledger.results() == RunLedger(seq_out / "ledger.sqlite").results()  # same table as the sequential run
