"""Two real party servers (subprocesses, mutual TLS on 127.0.0.1) started from the example configs."""

import shutil
import sqlite3
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from modelward.cli.audit import app as audit_app
from modelward.cli.party import app as party_app
from modelward.cli.split import app as split_app
from modelward.core.data import DataConfig, load_data
from modelward.core.init import init_model_
from modelward.core.io import load_tensors
from modelward.core.train import TrainConfig, train
from modelward.core.zoo import ModelConfig, build_model
from modelward.governance.driver import PartyUnavailable, SplitDriver, load_split_config
from modelward.governance.launch import stop_parties
from modelward.governance.party import ConsentDenied, TLSConfig
from modelward.governance.wire import WireError

EX = Path(__file__).resolve().parents[2] / "examples"
STEPS = 6
runner = CliRunner()


def _tls(certs: Path, who: str) -> TLSConfig:
    return TLSConfig(ca=str(certs / "ca.pem"), cert=str(certs / f"{who}.pem"), key=str(certs / f"{who}.key"))


@pytest.fixture(scope="module")
def parties(tmp_path_factory):
    root = tmp_path_factory.mktemp("gov2")
    r = runner.invoke(party_app, ["certs", "--out", str(root / "certs"), "--parties", "alice,bob,mallory"])
    assert r.exit_code == 0, r.output
    other = root / "other"
    assert runner.invoke(party_app, ["certs", "--out", str(other), "--parties", "alice"]).exit_code == 0
    procs = {}
    overrides = {}
    for p in ("alice", "bob"):
        overrides[p] = ["port=0", "threads=1", f"checkpoint_dir={root / p / 'ckpt'}", f"audit_db={root / p / 'audit.db'}",
                        f"tls.ca={root / 'certs/ca.pem'}", f"tls.cert={root / f'certs/{p}.pem'}",
                        f"tls.key={root / f'certs/{p}.key'}"]
    from modelward.governance import launch

    spawned = {p: launch.spawn_party(EX / f"party_{p}.toml", root / f"{p}.log", overrides[p]) for p in overrides}
    procs = {p: launch.wait_ready(proc, EX / f"party_{p}.toml", root / f"{p}.log", off)
             for p, (proc, off) in spawned.items()}
    yield root, procs
    stop_parties(list(procs.values()))


def _split_overrides(root, procs, steps=STEPS):
    parties = ", ".join(f'{{name = "{n}", address = "127.0.0.1:{procs[n].port}"}}' for n in ("alice", "bob"))
    return ["--set", f"parties=[{parties}]", "--set", f"out_dir={root / 'driver'}",
            "--set", f"tls.ca={root / 'certs/ca.pem'}", "--set", f"tls.cert={root / 'certs/alice.pem'}",
            "--set", f"tls.key={root / 'certs/alice.key'}", "--set", f"train.steps={steps}",
            "--set", "train.eval_every=3", "--set", "timeout_s=30"]


def test_cli_split_training_equals_monolithic(parties):
    root, procs = parties
    r = runner.invoke(split_app, ["train", str(EX / "split_digits.toml"), *_split_overrides(root, procs)])
    assert r.exit_code == 0, r.output
    assert (root / "driver/steps.csv").read_text().count("\n") == STEPS + 1
    assert "alice_sent" in (root / "driver/steps.csv").read_text().splitlines()[0]
    cfg = load_split_config(EX / "split_digits.toml", _split_overrides(root, procs)[1::2])
    with SplitDriver(cfg) as drv:
        ex = drv.checkpoint_all(export=True)
    state = {**load_tensors(ex["alice"]["export"]), **load_tensors(ex["bob"]["export"])}
    data = load_data(DataConfig(source="digits", seed=0))
    model = init_model_(build_model(ModelConfig(arch="cnn", channels=[16, 32], fc=64), (1, 8, 8), 10),
                        "glorot_uniform", 0)
    tc = TrainConfig.model_validate({**cfg.train.model_dump()})
    res = train(model, data.x_train, data.y_train, data.x_test, data.y_test, tc, seed=cfg.seed)
    ref = model.state_dict()
    assert set(state) == set(ref)
    for k, v in ref.items():
        torch.testing.assert_close(state[k].to(v.dtype), v, atol=1e-5, rtol=1e-5, msg=k)
    import json
    assert [tuple(c) for c in json.loads((root / "driver/curve.json").read_text())] == res.curve


def test_refused_pass_leaves_state_bit_identical(parties):
    root, procs = parties
    cfg = load_split_config(EX / "split_digits.toml", _split_overrides(root, procs, steps=1000)[1::2])
    with SplitDriver(cfg, session="refusals") as drv:
        st = drv.open(train=True)
        before = {n: s["digest"] for n, s in st.items()}
        step = st["alice"]["step"]
        with pytest.raises(ConsentDenied, match="max_batch"):
            drv.call("alice", "forward", step, {"purpose": "train"}, {"idx": torch.arange(600)})
        with pytest.raises(ConsentDenied, match="max_batch"):
            drv.call("bob", "loss_backward", step, {}, {"h": torch.zeros(600, 16, 4, 4), "idx": torch.arange(600)})
        with pytest.raises(WireError, match="expected B×16×4×4"):
            drv.call("bob", "loss_backward", step, {}, {"h": torch.zeros(8, 3), "idx": torch.arange(8)})
        with pytest.raises(WireError, match="NaN"):
            drv.call("bob", "loss_backward", step, {}, {"h": torch.full((8, 16, 4, 4), float("nan")),
                                                        "idx": torch.arange(8)})
        after = {n: drv.call(n, "status").meta["digest"] for n in drv.names}
        assert after == before
        drv.train_step(step, torch.arange(8))  # a good pass still works, and changes the state
        assert drv.call("bob", "status").meta["digest"] != before["bob"]
        drv.seq["bob"] -= 1  # resend an old sequence number
        with pytest.raises(WireError, match="replayed"):
            drv.call("bob", "forward", 0, {"purpose": "eval", "split": "test", "metric": "error"},
                     {"h": torch.zeros(2, 16, 4, 4), "idx": torch.arange(2)})
        drv.seq["bob"] += 3
        with pytest.raises(WireError, match="out-of-order"):
            drv.call("bob", "forward", 0, {"purpose": "predict"}, {"h": torch.zeros(2, 16, 4, 4)})


def test_unknown_certificates_are_refused(parties):
    root, procs = parties
    base = load_split_config(EX / "split_digits.toml", _split_overrides(root, procs)[1::2])
    stranger = base.model_copy(update={"tls": _tls(root / "other", "alice"), "timeout_s": 5.0})
    stranger.tls.ca = str(root / "certs/ca.pem")  # trusts the servers, but its own cert is from another CA
    with SplitDriver(stranger) as drv, pytest.raises(PartyUnavailable):
        drv.call("bob", "status")
    mallory = base.model_copy(update={"tls": _tls(root / "certs", "mallory")})
    with SplitDriver(mallory) as drv, pytest.raises(ConsentDenied, match="'mallory' is not an allowed peer"):
        drv.call("bob", "status")
    db = sqlite3.connect(root / "bob/audit.db")
    assert db.execute("SELECT COUNT(*) FROM audit WHERE caller='mallory' AND decision='deny'").fetchone()[0] == 1


def test_predict_and_audit_verify(parties, tmp_path):
    root, procs = parties
    r = runner.invoke(split_app, ["predict", str(EX / "split_digits.toml"), *_split_overrides(root, procs)])
    assert r.exit_code == 0, r.output
    lines = (root / "driver/predictions.csv").read_text().splitlines()
    assert len(lines) == 1 + 360 and lines[0].startswith("index,prediction,logit_0")
    copy = tmp_path / "bob.db"
    shutil.copy(root / "bob/audit.db", copy)
    for suffix in ("-wal", "-shm"):
        if (root / f"bob/audit.db{suffix}").exists():
            shutil.copy(root / f"bob/audit.db{suffix}", tmp_path / f"bob.db{suffix}")
    r = runner.invoke(audit_app, ["verify", str(copy)])
    assert r.exit_code == 0 and "OK" in r.output, r.output
    db = sqlite3.connect(copy)
    db.execute("UPDATE audit SET batch = 1 WHERE id = 5")
    db.commit()
    db.close()
    r = runner.invoke(audit_app, ["verify", str(copy)])
    assert r.exit_code == 1 and "record 5" in r.output and "edited" in r.output
