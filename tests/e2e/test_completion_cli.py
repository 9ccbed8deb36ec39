"""End to end: the completion study CLI, kill -9 + resume, bad study files, report rebuild."""

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

import pytest

STUDY = """
name = "tiny"
seeds = [0, 1, 2]
alphas = [0.5, 1.0]
parts = ["fc1", "logits"]
[[procedures]]
name = "T1"
kind = "T1"
[[procedures]]
name = "T4"
kind = "T4"
init = "msra"
[data]
source = "wine"
[model]
arch = "mlp"
hidden = [16]
[train]
optimizer = "sgd"
lr = 0.02
steps = 400
eval_every = 5
batch_size = 16
"""

CLI = [sys.executable, "-m", "modelward.cli.main"]


def _done(db: Path) -> dict[str, str]:
    if not db.exists():
        return {}
    try:
        con = sqlite3.connect(db, timeout=30)
        rows = con.execute("SELECT run_id, result FROM runs WHERE status='done'").fetchall()
        con.close()
        return dict(rows)
    except sqlite3.OperationalError:
        return {}


def test_kill9_then_resume_keeps_finished_runs(tmp_path):
    study = tmp_path / "study.toml"
    study.write_text(STUDY)
    out = tmp_path / "out"
    db = out / "ledger.sqlite"
    proc = subprocess.Popen([*CLI, "complete", "run", str(study), "--out", str(out), "--workers", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 120
    # interrupt right after the first retraining run is recorded: each run takes ~1 s, so most are unfinished
    while time.time() < deadline and not any(k.startswith("re|") for k in _done(db)) and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = _done(db)
    assert 2 <= len(before) < 18, sorted(before)  # interrupted part-way (originals + ≥ 1 retraining run)
    r = subprocess.run([*CLI, "complete", "run", str(study), "--out", str(out), "--workers", "2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resuming" in r.stdout
    con = sqlite3.connect(db)
    rows = con.execute("SELECT run_id, status, result, attempts FROM runs").fetchall()
    assert len(rows) == 3 + 3 * 2 * 2 + 3 and all(s == "done" for _, s, _, _ in rows)  # + T0 per seed
    after = {rid: res for rid, _, res, _ in rows}
    assert all(after[k] == v for k, v in before.items())  # finished runs kept, never recomputed
    attempts = {rid: a for rid, _, _, a in rows}
    assert all(attempts[k] == 1 for k in before)
    with (out / "hardness.csv").open() as f:
        table = list(csv.DictReader(f))
    assert list(table[0])[:11] == ["part", "procedure", "group", "alpha", "median", "mean", "sd", "min", "max",
                                   "n", "capped"]
    assert "not_reached" in table[0] and "mean_uncapped" in table[0]
    assert len(table) == 2 + 2 * 2 * 2 and all(int(r["n"]) == 3 for r in table)  # 2 T0 rows (one per α)
    for r in table:  # the summary columns agree with each other (capping at 1 only lowers the mean)
        lo, med, mean, hi = (float(r[k]) for k in ("min", "median", "mean", "max"))
        assert 0.0 <= lo <= med <= hi <= 1.0 and lo <= mean <= hi and float(r["sd"]) >= 0.0, r
        assert mean <= float(r["mean_uncapped"]) + 1e-12 and int(r["capped"]) <= int(r["n"]), r
    inf = list(csv.DictReader((out / "hardness_inf.csv").open()))
    assert {r["procedure"] for r in inf} <= {"T1", "T4", "T0"} and len(inf) == 4
    for f in ("hardness.md", "hardness_T1.png", "hardness_T4.png", "parts.csv", "study.json"):
        assert (out / f).is_file(), f
    assert len(list((out / "curves").glob("*.csv"))) == 18
    # report rebuilds the same table from the run files
    (out / "hardness.csv").unlink()
    r = subprocess.run([*CLI, "complete", "report", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and list(csv.DictReader((out / "hardness.csv").open())) == table


@pytest.mark.parametrize("edit,message", [
    ('kind = "T4"', "field 'procedures.1.kind': got 'T9'"),
    ('parts = ["fc1", "logits"]', "unknown part 'conv7'; valid parts: fc1, logits"),
    ("alphas = [0.5, 1.0]", "field 'alphas'"),
])
def test_bad_study_files_give_clear_errors(tmp_path, edit, message):
    bad = {'kind = "T4"': 'kind = "T9"', 'parts = ["fc1", "logits"]': 'parts = ["conv7"]',
           "alphas = [0.5, 1.0]": "alphas = [0.5, 1.5]"}[edit]
    study = tmp_path / "bad.toml"
    study.write_text(STUDY.replace(edit, bad))
    r = subprocess.run([*CLI, "complete", "run", str(study), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert message in " ".join(r.stderr.split()), r.stderr
    assert "Traceback" not in r.stderr


def test_same_folder_different_study_is_refused(tmp_path):
    from modelward.completion.study import StudyConfig, run_study
    from modelward.errors import LedgerError

    cfg = StudyConfig.model_validate({"data": {"source": "iris"}, "model": {"arch": "mlp", "hidden": [4]},
                                      "train": {"steps": 10, "eval_every": 5}, "seeds": [0], "parts": ["logits"],
                                      "procedures": [{"name": "T2", "kind": "T2"}]})
    run_study(cfg, tmp_path, workers=1)
    assert json.loads((tmp_path / "study.json").read_text())["seeds"] == [0]
    with pytest.raises(LedgerError, match="different 'config'"):
        run_study(cfg.model_copy(update={"seeds": [0, 1]}), tmp_path, workers=1)


def test_empty_study_file_is_refused(tmp_path):
    study = tmp_path / "empty.toml"
    study.write_text("# nothing here yet\n")
    r = subprocess.run([*CLI, "complete", "run", str(study), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "the study file is empty" in " ".join(r.stderr.split())
    assert not (tmp_path / "o").exists()
