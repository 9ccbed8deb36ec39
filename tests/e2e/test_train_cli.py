"""`modelward train`: a config's [data]/[model]/[train] tables -> a safetensors checkpoint others can serve."""

from __future__ import annotations

import subprocess
import sys

from modelward.core.io import load_state_dict
from modelward.core.zoo import ModelConfig, build_model


def test_train_writes_a_loadable_checkpoint(tmp_path):
    cfg = tmp_path / "t.toml"
    cfg.write_text('[data]\nsource = "iris"\n[model]\narch = "mlp"\nhidden = [8]\n'
                   "[train]\nsteps = 60\neval_every = 20\nlr = 0.05\n[[procedures]]\nname = 'T1'\nkind = 'T1'\n")
    out = tmp_path / "m.safetensors"
    r = subprocess.run([sys.executable, "-m", "modelward.cli.main", "train", str(cfg), "--out", str(out),
                        "--set", "train.steps=80"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    state, meta = load_state_dict(out)
    assert meta["num_classes"] == 3 and meta["input_shape"] == [4] and meta["final_test_loss"] < 0.5
    model = build_model(ModelConfig.model_validate(meta["model"]), tuple(meta["input_shape"]), meta["num_classes"])
    model.load_state_dict(state)
    bad = subprocess.run([sys.executable, "-m", "modelward.cli.main", "train", str(cfg), "--out", str(out),
                          "--set", "model.arch=transformer"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "field 'model.arch'" in " ".join(bad.stderr.split())
