"""Split training across a 150 ms round trip (issue #27): the shipped parties and the shipped client, every link
through the userspace shaping proxy, train exactly like monolithic training (bounded: 4 steps)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from modelward.governance.transport.launch import spawn_party, stop_parties, wait_ready
from modelward.governance.transport.shaping import ShapingProxy

EX = Path(__file__).resolve().parents[2] / "examples"
STEPS = 4
ONE_WAY_MS = 75  # 150 ms round trip on every link


def _mw(*args, cwd):
    import os

    from typer.testing import CliRunner

    from modelward.cli.main import app

    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    finally:
        os.chdir(old)


def _train_through_proxies(root: Path, one_way_ms: float, train_args: list[str], exact: list[str] | None = None
                           ) -> tuple[float, list]:
    """Certificates, the two shipped parties (alice, bob; driver "operator") each behind a ShapingProxy of
    `one_way_ms`, then ``split train`` with `train_args`; returns (seconds of split train, the proxies)."""
    r = _mw("party", "certs", "--out", root / "certs", "--parties", "alice,bob,operator", cwd=root)
    assert r.exit_code == 0, r.output
    sets = {}
    for p, other in (("alice", "bob"), ("bob", "alice")):
        sets[p] = [f"checkpoint_dir={root / p / 'ckpt'}", f"audit_db={root / p / 'audit.db'}",
                   f"address_file={root / p / 'address'}", f"tls.ca={root / 'certs/ca.pem'}",
                   f"tls.cert={root / f'certs/{p}.pem'}", f"tls.key={root / f'certs/{p}.key'}",
                   f"peers.{other}.cert={root / f'certs/{other}.pem'}",
                   f"peers.operator.cert={root / 'certs/operator.pem'}", "init.test_seed=0", "threads=1",
                   # bounded influence scales some honest steps (BatchNorm's first running statistics, clipped
                   # rows): a run compared with monolithic training turns it off, as label protection below
                   "integrity.influence.enabled=false"]
    sets["bob"] += [*(exact or []), "label_protection.method=none"]  # exact gradients: compared with monolithic below
    spawned = {p: spawn_party(EX / f"party_{p}.toml", root / f"{p}.log", sets[p]) for p in sets}
    procs = {p: wait_ready(proc, EX / f"party_{p}.toml", root / f"{p}.log", off) for p, (proc, off) in spawned.items()}
    proxies = [ShapingProxy((root / p / "address").read_text().strip(), delay_ms=one_way_ms).start()
               for p in ("alice", "bob")]
    try:
        cfg = (EX / "split_digits.toml").read_text()
        cfg = cfg.replace('address_file = "../runs/governance/alice/address"', f'address = "{proxies[0].address}"')
        cfg = cfg.replace('address_file = "../runs/governance/bob/address"', f'address = "{proxies[1].address}"')
        for p in ("alice", "bob", "operator"):
            cfg = cfg.replace(f"../runs/governance/certs/{p}", str(root / f"certs/{p}"))
        cfg = cfg.replace("../runs/governance/certs/ca.pem", str(root / "certs/ca.pem"))
        cfg = cfg.replace('out_dir = "../runs/governance/split"', f'out_dir = "{root / "driver"}"')
        (root / "split.toml").write_text(cfg)
        t0 = time.monotonic()
        r = _mw("split", "train", root / "split.toml", *train_args, "--set", "timeout_s=60", cwd=root)
        seconds = time.monotonic() - t0
        assert r.exit_code == 0, r.output[-3000:]
        assert all(px.bytes_forwarded > 0 for px in proxies)  # every link really went through the proxy
        return seconds, proxies
    finally:
        for px in proxies:
            px.stop()
        stop_parties(list(procs.values()))


@pytest.mark.slow
def test_split_training_over_a_150ms_link_matches_monolithic(tmp_path: Path, assert_split_equals_monolithic,
                                                            exact_policy) -> None:
    root = tmp_path
    seconds, _ = _train_through_proxies(root, ONE_WAY_MS, ["--set", f"train.steps={STEPS}", "--set",
                                                           "train.eval_every=2"], [exact_policy(root)])
    assert seconds > STEPS * 2 * ONE_WAY_MS / 1000  # and paid its round trips
    assert (root / "driver/steps.csv").read_text().count("\n") == STEPS + 1
    assert_split_equals_monolithic(root, STEPS, 2)


STALE_STEPS = 40
STALE_ONE_WAY_MS = 60  # 120 ms round trip on every link


@pytest.mark.slow
def test_bounded_staleness_over_a_120ms_link_lands_near_monolithic_faster_than_a_round_trip_per_step(
        tmp_path: Path) -> None:
    """``staleness = 1`` (issue #27 item 3) through the proxy at 120 ms RTT: the shipped parties and client train
    40 steps in bounded time; every party committed every step (a checkpoint of step 40 on both); the final test
    error lies within 0.05 of monolithic training with the same recipe; and steps overlapped on the alice↔bob
    link (consecutive steps reached bob less than one round trip apart), which the exact modes cannot do."""
    import json

    from modelward.core.data import DataConfig, load_data
    from modelward.core.init import init_model_
    from modelward.core.train import TrainConfig, train
    from modelward.core.zoo import ModelConfig, build_model

    root = tmp_path
    seconds, _ = _train_through_proxies(root, STALE_ONE_WAY_MS, [
        "--set", f"train.steps={STALE_STEPS}", "--set", f"train.eval_every={STALE_STEPS}", "--set", "staleness=1"])
    assert seconds < 120  # bounded
    rows = (root / "driver/steps.csv").read_text().splitlines()
    assert [int(r.split(",")[0]) for r in rows[1:]] == list(range(STALE_STEPS))
    # steps overlapped on the alice↔bob link: consecutive steps reached bob less than one round trip apart, which
    # the exact modes cannot do (alice sends step s+1 only after bob's answer to s came back). Counted, not timed
    # on average: the average time per step also holds the CPU time, which a loaded host (two test workers and
    # the party processes on two cores) inflates past the round trip (measured 200 ms per step there)
    import sqlite3

    db = sqlite3.connect(root / "bob" / "audit.db")
    ts = [t for (t,) in db.execute("SELECT ts FROM audit WHERE op='step' AND caller='alice' AND decision='allow' "
                                   "ORDER BY id")]
    db.close()
    rtt = 2 * STALE_ONE_WAY_MS / 1000
    gaps = [b - a for a, b in zip(ts, ts[1:], strict=False)]
    assert len(ts) == STALE_STEPS and sum(g < 0.9 * rtt for g in gaps) >= 3, (rtt, gaps)
    for p in ("alice", "bob"):
        assert (root / p / "ckpt" / f"step_{STALE_STEPS:08d}.safetensors").is_file(), p
    split_error = json.loads((root / "driver/curve.json").read_text())[-1][1]
    data = load_data(DataConfig(source="digits", seed=0))
    model = init_model_(build_model(ModelConfig(arch="cnn", channels=[16, 32], fc=64), (1, 8, 8), 10),
                        "glorot_uniform", 0)
    tc = TrainConfig(optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=1e-4, batch_size=64, steps=STALE_STEPS,
                     eval_every=STALE_STEPS, loss="error")
    mono_error = train(model, data.x_train, data.y_train, data.x_test, data.y_test, tc, seed=0).curve[-1][1]
    assert abs(split_error - mono_error) <= 0.05, (split_error, mono_error)
