"""End to end: an RL completion study (examples/completion_cartpole.toml) via the CLI, kill -9, resume, report."""

from __future__ import annotations

import csv
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "completion_cartpole.toml"
CLI = [sys.executable, "-m", "modelward.cli.main"]


def _done(db: Path) -> dict[str, str]:
    if not db.exists():
        return {}
    try:
        con = sqlite3.connect(db, timeout=5)
        rows = con.execute("SELECT run_id, result FROM runs WHERE status='done'").fetchall()
        con.close()
        return dict(rows)
    except sqlite3.OperationalError:
        return {}


def test_rl_study_kill9_resume_and_report(tmp_path):
    out = tmp_path / "out"
    db = out / "ledger.sqlite"
    cmd = [*CLI, "complete", "run", str(EXAMPLE), "--out", str(out), "--workers", "1",
           "--set", 'parts=["linear"]', "--set", "seeds=[0, 1]", "--set", "rl.steps=1000",
           "--set", "rl.dqn.train_every=4",  # the example, shortened for the test
           "--set", "rl.filter_random=false"]  # a 1000-step agent may be filtered; then retraining is skipped
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, env=env)
    deadline = time.time() + 120
    while time.time() < deadline and sum(k.startswith("re|") for k in _done(db)) < 1 and proc.poll() is None:
        time.sleep(0.2)
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = _done(db)
    assert 2 <= len(before) < 8
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    con = sqlite3.connect(db)
    rows = con.execute("SELECT run_id, status, result, attempts FROM runs").fetchall()
    assert len(rows) == 2 * (1 + 2 + 1) and all(s == "done" for _, s, _, _ in rows)  # + T0 per seed
    after = {rid: res for rid, _, res, _ in rows}
    assert all(after[k] == v for k, v in before.items())  # finished runs are kept, not recomputed
    origs = [json.loads(v) for k, v in after.items() if k.startswith("orig|")]
    for o in origs:
        assert o["task"] == "CartPole-v1" and o["curve"][0][0] == 0 and o["curve"][-1][0] == 1000
        assert (out / o["checkpoint"]).is_file() and Path(o["extras"]["replay_buffer"]).is_file()
    for k, v in after.items():
        if k.startswith("re|"):
            curve = json.loads(v)["curve"]
            assert curve[0][0] == 0 and curve[-1][0] <= 1000  # cost = env steps, budget = original length
    table = list(csv.DictReader((out / "hardness.csv").open()))
    assert {r["procedure"] for r in table} == {"T1-kept", "T1-reset", "T0"}
    for r in table:
        if r["n"] != "0":  # the summary columns agree with each other
            lo, med, mean, hi = (float(r[k]) for k in ("min", "median", "mean", "max"))
            assert 0.0 <= lo <= med <= hi <= 1.0 and lo <= mean <= hi, r
    assert (out / "hardness.md").is_file()
