"""`modelward demo --quick`: split training over real sockets feeds the completion study (and the guarded API)."""

from __future__ import annotations

import csv
import subprocess
import sys


def test_quick_demo_end_to_end(tmp_path):
    out = tmp_path / "demo"
    # a relative --out, exactly as `make demo` passes it
    r = subprocess.run([sys.executable, "-m", "modelward.cli.main", "demo", "--quick", "--out", "demo",
                        "--workers", "1"], capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = list(csv.DictReader((out / "completion" / "hardness.csv").open()))
    assert {r["part"] for r in rows} == {"conv1", "conv2+fc1+logits", "(all)"}  # (all): the T0 reference
    for row in rows:  # the summary columns agree with each other (`r` is the demo's process result)
        lo, med, mean, hi = (float(row[k]) for k in ("min", "median", "mean", "max"))
        assert 0.0 <= lo <= med <= hi <= 1.0 and lo <= mean <= hi, row
    md = (out / "completion" / "hardness.md").read_text()
    assert "## α = 1" in md and "conv2+fc1+logits" in md
    # seed 0's original model is the one trained split between the parties
    assert list((out / "completion" / "checkpoints").glob("original_seed0_split.safetensors"))
    assert "audit logs verified" in r.stdout
    # step 4: one security report, with the split's completion hardness read from step 2's study
    import json

    report = json.loads((out / "report" / "report.json").read_text())
    by = {s["section"]: s for s in report["sections"]}
    assert by["completion"]["status"] == "assessed", by["completion"]
    assert {r["party"] for r in by["completion"]["tables"][0]["rows"]} == {"alice", "bob"}
    assert (out / "report" / "report.html").is_file() and "security report:" in r.stdout
