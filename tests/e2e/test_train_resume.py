"""`modelward train` never replaces a checkpoint silently and resumes after Ctrl-C (issue 31 item 11)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from modelward.core.io import load_state_dict

SRC = str(Path(__file__).resolve().parents[2] / "src")
CFG = ('[data]\nsource = "digits"\n[model]\narch = "mlp"\nhidden = [32]\n'
       "[train]\nsteps = 400\neval_every = 50\nlr = 0.05\nbatch_size = 32\n")


def _cmd(tmp: Path, out: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "modelward.cli.main", "train", str(tmp / "t.toml"), "--out", str(tmp / out),
            "--checkpoint-every", "10", *extra]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}


def test_an_existing_checkpoint_is_replaced_only_with_force(tmp_path):
    (tmp_path / "t.toml").write_text(CFG.replace("steps = 400", "steps = 20").replace("eval_every = 50",
                                                                                      "eval_every = 10"))
    r = subprocess.run(_cmd(tmp_path, "m.safetensors"), capture_output=True, text=True, timeout=120, env=_env())
    assert r.returncode == 0, r.stderr
    before = (tmp_path / "m.safetensors").read_bytes()
    r = subprocess.run(_cmd(tmp_path, "m.safetensors", "--seed", "1"), capture_output=True, text=True, timeout=120,
                       env=_env())
    assert r.returncode == 2 and "--force" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert (tmp_path / "m.safetensors").read_bytes() == before  # the good model is still there
    r = subprocess.run(_cmd(tmp_path, "m.safetensors", "--seed", "1", "--force"), capture_output=True, text=True,
                       timeout=120, env=_env())
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "m.safetensors").read_bytes() != before
    assert not list(tmp_path.glob(".*progress*"))  # a finished run leaves no mid-run state behind


def test_ctrl_c_then_the_same_command_resumes_and_ends_where_an_uninterrupted_run_does(tmp_path):
    (tmp_path / "t.toml").write_text(CFG)
    proc = subprocess.Popen(_cmd(tmp_path, "m.safetensors"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env())
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".m.safetensors.*.progress.safetensors")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    if (tmp_path / "m.safetensors").exists():  # it finished before the signal arrived: nothing to resume
        return
    r = subprocess.run(_cmd(tmp_path, "m.safetensors"), capture_output=True, text=True, timeout=180, env=_env())
    assert r.returncode == 0, r.stderr
    assert "resuming from step" in r.stdout, r.stdout
    ref = subprocess.run(_cmd(tmp_path, "ref.safetensors"), capture_output=True, text=True, timeout=180, env=_env())
    assert ref.returncode == 0, ref.stderr
    resumed, meta = load_state_dict(tmp_path / "m.safetensors")
    straight, ref_meta = load_state_dict(tmp_path / "ref.safetensors")
    for k, v in straight.items():
        assert torch.equal(resumed[k], v), k
    assert meta["final_test_loss"] == ref_meta["final_test_loss"]
