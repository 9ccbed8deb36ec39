"""`split train --host alice.toml`: the driver's organisation runs its own party inside the driver's process (one
network hop less per step). Bob is a real server process on 127.0.0.1; everything a party guarantees still holds:
monolithic equivalence, consent and audit on both sides, cross-anchored logs, one server per state folder."""

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from modelward.core.config import to_toml
from modelward.core.data import DataConfig, load_data
from modelward.core.init import init_model_
from modelward.core.io import load_tensors
from modelward.core.train import TrainConfig, train
from modelward.core.zoo import ModelConfig, build_model
from modelward.governance.audit import verify_against
from modelward.governance.demo import prepare_local_split
from modelward.governance.driver import SplitDriver, hosted_connect, load_split_config
from modelward.governance.party.checkpoints import Checkpoints
from modelward.governance.party.config import load_party_config
from modelward.governance.protocol import StepRolledBack
from modelward.governance.transport.launch import spawn_party, start_party
from modelward.governance.transport.server import hosted_party

STEPS = 6


@contextlib.contextmanager
def _hosted_split(root: Path):
    data = load_data(DataConfig(source="digits", seed=0))
    model = init_model_(build_model(ModelConfig(arch="cnn", channels=[4, 8], fc=16), (1, 8, 8), 10), seed=0)
    split = prepare_local_split(root, model, data, ["alice", "bob"], ["conv1"], threads=1)
    split.start(["bob"])  # alice has no server: the driver hosts her
    tc = TrainConfig(steps=STEPS, eval_every=3, batch_size=32)
    cfg = split.split_config(tc, seed=0).model_dump(mode="json", exclude_none=True)
    (root / "split.toml").write_text(to_toml(cfg))
    try:
        yield root, split, model, data, tc
    finally:
        split.stop()


@pytest.fixture(scope="module")
def hosted(tmp_path_factory):
    with _hosted_split(tmp_path_factory.mktemp("hosted")) as h:
        yield h


@pytest.fixture
def fresh_hosted(tmp_path):
    """Parties nobody has trained yet: the module's other tests train on the shared ones, in any order."""
    with _hosted_split(tmp_path) as h:
        yield h


def test_hosted_driver_trains_like_monolithic_with_both_parties_auditing(fresh_hosted):
    from modelward.cli.main import app

    root, split, model, data, tc = fresh_hosted
    r = CliRunner().invoke(app, ["split", "train", str(root / "split.toml"), "--host",
                                 str(split.party_configs["alice"])], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    curve = [tuple(c) for c in json.loads((root / "driver/curve.json").read_text())]
    mono = train(model, data.x_train, data.y_train, data.x_test, data.y_test, tc, seed=0)
    assert curve == [tuple(c) for c in mono.curve]
    # alice's record of every step names the driver as the caller; bob's names alice (peer to peer)
    for party, caller in (("alice", "alice"), ("bob", "alice")):
        db = sqlite3.connect(root / party / "audit.db")
        steps = db.execute("SELECT COUNT(*) FROM audit WHERE op = 'step' AND decision = 'allow' AND caller = ?",
                           (caller,)).fetchone()[0]
        db.close()
        assert steps == STEPS, party
    # the hosted party's log is closed cleanly (checkpoint saved, synced) and the cross-anchors agree both ways
    assert verify_against(root / "bob/audit.db", root / "alice/audit.db").ok
    assert verify_against(root / "alice/audit.db", root / "bob/audit.db").ok
    assert STEPS in Checkpoints(root / "alice/checkpoints", 3).list()
    # predictions through the hosted party too (alice has no server to reach)
    r = CliRunner().invoke(app, ["split", "predict", str(root / "split.toml"), "--host",
                                 str(split.party_configs["alice"])], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    lines = (root / "driver/predictions.csv").read_text().splitlines()
    assert len(lines) == 1 + len(data.y_test) and lines[0].startswith("index,prediction,logit_0")


@pytest.mark.parametrize("carrier", ["step", "eval"])
def test_a_late_refusal_aborts_the_step_on_the_real_party_process(hosted, carrier):
    """Alice (hosted) answers the driver before her own update is checked. When that check fails, Bob — a real
    process that prepared the same step over gRPC and mutual TLS — must not commit it: the request carrying its
    commit (the next step, or an evaluation) is refused, the driver's vote round finds the refusal and aborts the
    step everywhere."""
    root, split, _, _, _ = hosted
    cfg = load_split_config(root / "split.toml")
    with hosted_party(load_party_config(split.party_configs["alice"])) as alice, \
            SplitDriver(cfg, connect=hosted_connect(alice, cfg)) as drv:
        drv.open(train=True)
        step = drv.status["alice"]["step"]
        bob_before = drv.call("bob", "status", meta={"digest": True}).meta["digest"]
        alice_before = alice.state_digest()
        alice.cfg.max_abs_param = 1e-9
        drv.train_step(step, torch.arange(32), lazy=True)  # answered: alice's check has not spoken yet
        with pytest.raises(StepRolledBack, match="party alice: the update of step"):
            if carrier == "step":
                drv.train_step(step + 1, torch.arange(32), lazy=True)
            else:
                drv.evaluate()
        bob = drv.call("bob", "status", meta={"digest": True}).meta
        assert (bob["digest"], bob["step"], bob["prepared"]) == (bob_before, step, None)
        assert alice.state_digest() == alice_before and (alice.step, alice.prepared) == (step, None)
        alice.cfg.max_abs_param = 1e6
        drv.train_step(step, torch.arange(32), lazy=True)  # and the step goes through once the cause is gone
        if carrier == "step":
            drv.flush()
        else:
            drv.evaluate()  # carrying its commit to the real bob
        bob = drv.call("bob", "status").meta
        assert (bob["step"], bob["prepared"]) == (step + 1, None) and (alice.step, alice.prepared) == (step + 1, None)


def test_a_hosted_party_cannot_also_be_served(hosted, tmp_path):
    root, split, *_ = hosted
    cfg = load_party_config(split.party_configs["alice"])
    with hosted_party(cfg):
        proc, _ = spawn_party(split.party_configs["alice"], tmp_path / "alice2.log")
        assert proc.wait(timeout=120) != 0
    log = (tmp_path / "alice2.log").read_text()
    assert "checkpoints" in log and "Traceback" not in log, log[-2000:]


def test_hosting_a_party_the_split_does_not_list_is_refused(hosted, tmp_path):
    from modelward.errors import ConfigError
    from modelward.governance.driver import SplitDriver, hosted_connect, load_split_config

    root, split, *_ = hosted
    cfg = load_split_config(root / "split.toml")
    cfg.parties[0].name = "carol"
    with hosted_party(load_party_config(split.party_configs["alice"])) as alice:
        with pytest.raises(ConfigError, match="carol"):
            SplitDriver(cfg, connect=hosted_connect(alice, cfg))


def test_kill_9_of_the_hosting_driver_resumes_with_no_step_lost_or_repeated(tmp_path):
    """The driver process hosting alice dies (kill -9) mid-run: alice's in-memory state and the driver go with it,
    bob keeps a prepared step. Rerunning the same command resumes from the common checkpoint and ends where a
    monolithic run ends; both audit logs stay intact and anchored to each other."""
    data = load_data(DataConfig(source="digits", seed=0))
    model = init_model_(build_model(ModelConfig(arch="cnn", channels=[4, 8], fc=16), (1, 8, 8), 10), seed=0)
    (tmp_path / "slowpass.py").write_text("import time\n\ndef ok(request):\n    time.sleep(0.04)\n    return True\n")
    policy = {"allow_peers": ["alice"], "training": True, "inference": True, "approval": "slowpass:ok",
              "approval_scope": "pass"}  # bob approves every pass after 40 ms: the run is slow enough to kill
    split = prepare_local_split(tmp_path / "run", model, data, ["alice", "bob"], ["conv1"], threads=1,
                                checkpoint_every=3, policies={"bob": policy})
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "MODELWARD_TRUST_CODE": "1"}  # bob's operator trusts the approval hook (a policy cannot say so itself)
    split.processes["bob"] = start_party(split.party_configs["bob"], tmp_path / "run/bob/server.log", env=env)
    tc = TrainConfig(steps=24, eval_every=6, batch_size=32)
    (tmp_path / "split.toml").write_text(to_toml(split.split_config(tc, seed=3).model_dump(mode="json",
                                                                                           exclude_none=True)))
    cmd = [sys.executable, "-m", "modelward.cli.main", "split", "train", str(tmp_path / "split.toml"), "--host",
           str(split.party_configs["alice"])]
    src = str(Path(__file__).resolve().parents[2] / "src")
    penv = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    try:
        driver = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=penv)
        deadline, done = time.monotonic() + 120, 0
        while done < 11 and time.monotonic() < deadline and driver.poll() is None:
            time.sleep(0.02)
            try:
                db = sqlite3.connect(tmp_path / "run/bob/audit.db")
                done = db.execute("SELECT COUNT(*) FROM audit WHERE op='step' AND decision='allow'").fetchone()[0]
                db.close()
            except sqlite3.OperationalError:
                pass
        assert driver.poll() is None and 11 <= done < tc.steps, done
        driver.kill()  # kill -9: the hosted alice dies with the driver
        driver.wait()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=penv)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        summary = json.loads((tmp_path / "run/driver/summary.json").read_text())
        assert summary["steps"] == tc.steps
    finally:
        split.stop()
    state = {}
    for p in ("alice", "bob"):
        ck = Checkpoints(tmp_path / f"run/{p}/checkpoints", 3)
        assert ck.list()[-1] == tc.steps
        state.update({k[6:]: v for k, v in load_tensors(ck.path(tc.steps)).items() if k.startswith("model.")})
    ref = build_model(ModelConfig(arch="cnn", channels=[4, 8], fc=16), (1, 8, 8), 10)
    ref.load_state_dict(model.state_dict())
    mono = train(ref, data.x_train, data.y_train, data.x_test, data.y_test, tc, seed=3)
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(state[k].to(v.dtype), v, atol=1e-5, rtol=1e-5, msg=k)
    assert [tuple(c) for c in json.loads((tmp_path / "run/driver/curve.json").read_text())] == \
        [tuple(c) for c in mono.curve]
    assert verify_against(tmp_path / "run/bob/audit.db", tmp_path / "run/alice/audit.db").ok
    assert verify_against(tmp_path / "run/alice/audit.db", tmp_path / "run/bob/audit.db").ok
