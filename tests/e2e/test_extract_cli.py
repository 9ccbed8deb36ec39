"""`modelward extract run` as a user runs it: the example config (shrunk), killed mid-run with SIGKILL, resumed."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from modelward.core.ledger import RunLedger

ROOT = Path(__file__).resolve().parents[2]
SHRINK = [
    "--set", "budget=200", "--set", "substitute.epochs=10", "--set", "victim.train.steps=80",
    "--set", 'victim.model={arch="mlp", hidden=[24]}', "--set", "centroid_epsilons=[]",
    "--set", 'defenses=[{name="none"}, {name="reverse_sigmoid", label="revsig"}, {name="top1"}]',
    "--set", 'attacks=[{strategy="naive"}, {strategy="top1"}]',
]


def _cmd(out: Path, cache: Path) -> list[str]:
    return [sys.executable, "-m", "modelward.cli.main", "extract", "run", str(ROOT / "examples/extraction_digits.toml"),
            "--out", str(out), *SHRINK, "--set", f'victim.cache_dir="{cache}"']


def test_extract_run_killed_and_resumed(tmp_path):
    out, cache = tmp_path / "run", tmp_path / "cache"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    proc = subprocess.Popen(_cmd(out, cache), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    ledger_path = out / "ledger.sqlite"
    deadline = time.time() + 120
    done_before = {}
    try:
        while time.time() < deadline and proc.poll() is None:
            if ledger_path.exists():
                done_before = RunLedger(ledger_path).results()
                if done_before:
                    break
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert done_before, proc.stderr.read().decode()[-2000:] if proc.stderr else "no cell finished"
    done_before = RunLedger(ledger_path).results()
    r = subprocess.run(_cmd(out, cache), capture_output=True, text=True, env=env, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "cells already done" in r.stdout and "worst case over attacks" in r.stdout
    final = RunLedger(ledger_path).results()
    assert len(final) == 6
    assert all(final[k] == v for k, v in done_before.items())  # finished cells were kept, not recomputed
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6
    assert "| **Max accuracy of w_s** |" in (out / "results.md").read_text()

