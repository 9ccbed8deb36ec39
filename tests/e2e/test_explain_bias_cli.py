"""`modelward explain` and `modelward bias` end to end (small configs; resumable through the runner)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "modelward.cli.main", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=240)


def test_explain_cli_writes_tables_and_grids_and_resumes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    args = ["explain", str(ROOT / "examples" / "explain_digits.toml"), "--out", str(out),
            "--set", "models.0.train.steps=40", "--set", "explain.n_inputs=3", "--set", "explain.classes=[0, 1]",
            "--set", "explain.top_k=2", "--set", "explain.steps=8", "--set", "explain.smoothgrad_samples=4",
            "--set", "explain.inversion_steps=5", "--set", "explain.per_class_points=4"]
    r = _cli(*args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for f in ("cnn/attributions.csv", "cnn/attributions.md", "cnn/attributions.png", "cnn/top_units.json",
              "cnn/top_units_attribution.png", "cnn/top_units_inversion.png", "compare_models.md", "compare.png",
              "models/cnn.safetensors"):
        assert (out / f).is_file(), f
    rows = json.loads((out / "cnn" / "top_units.json").read_text())
    assert {r["class"] for r in rows} == {0, 1} and all(r["layer"] == "fc1" for r in rows)
    ig = [r for r in json.loads((out / "cnn" / "attributions.json").read_text())
          if r["method"] == "integrated_gradients"]
    assert len(ig) == 3
    # re-running resumes: every run is done, nothing is recomputed (in-process, to save a interpreter start)
    from modelward.cli.main import main
    from modelward.core.ledger import RunLedger

    mtime = (out / "models" / "cnn.safetensors").stat().st_mtime
    with pytest.raises(SystemExit) as ok:  # typer exits 0 after the command
        main(args)
    assert ok.value.code in (0, None)
    assert (out / "models" / "cnn.safetensors").stat().st_mtime == mtime
    assert RunLedger(out / "ledger.sqlite").counts()["done"] == 4
    # a different config in the same folder is refused with a clear error (exit 2)
    with pytest.raises(SystemExit) as exc:
        main([*args[:-1], "explain.per_class_points=5"])
    assert exc.value.code == 2
    assert "different" in capsys.readouterr().err


def test_bias_cli_tables_and_local_files(tmp_path: Path) -> None:
    scipy_io = pytest.importorskip("scipy.io")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 12))
    y = np.where(x[:, 0] + 0.5 * rng.normal(size=60) > -0.3, 2, 1)  # labels as in scikit-feature files (1/2)
    scipy_io.savemat(tmp_path / "tiny.mat", {"X": x, "Y": y[:, None]})
    cfg = tmp_path / "bias.toml"
    cfg.write_text("""
seed = 0
[[datasets]]
name = "tiny"
mat_path = "tiny.mat"
splits = 3
mitigations = ["parity", "experts", "l1"]
[datasets.sgd]
max_iter = 50
[theorem]
cases = [[0.75, 0.5]]
samples = 20000
""")
    r = _cli("bias", str(cfg), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["mitigation"] for r in rows] == ["none", "parity", "experts", "l1"]
    assert all(r["splits"] == 3 and 0 <= r["acc"] <= 1 for r in rows)
    assert rows[0]["p"] > 0.5  # class 1 is the majority (Def. 9.1)
    theorem = json.loads((tmp_path / "out" / "theorem.json").read_text())
    assert abs(theorem[0]["theorem"] - 0.2382) < 1e-3 and abs(theorem[0]["z"]) < 4
    assert (tmp_path / "out" / "bias_by_mitigation.png").is_file()
    bad = _cli("bias", str(cfg), "--out", str(tmp_path / "o2"), "--set", "datasets.0.learner=xgb", cwd=tmp_path)
    assert bad.returncode == 2 and "valid choices" in bad.stderr
