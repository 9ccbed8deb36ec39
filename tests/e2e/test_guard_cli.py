"""`modelward guard check` on the example configs, and config errors that name the field."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from modelward.core.config import load_config
from modelward.core.io import save_state_dict
from modelward.core.zoo import build_model
from modelward.extraction.guard.config import GuardConfig
from modelward.extraction.guard.service import build_service

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("name", ["guard_modelguard_s.toml", "guard_modelguard_w.toml"])
def test_example_configs_load_and_check(tmp_path, name):
    cfg_path = tmp_path / name
    shutil.copy(EXAMPLES / name, cfg_path)
    cfg = load_config(cfg_path, GuardConfig)
    torch.manual_seed(0)
    model = build_model(cfg.model.net, tuple(cfg.model.input_shape), cfg.model.num_classes)
    save_state_dict(tmp_path / cfg.model.checkpoint, model.state_dict())
    r = subprocess.run([sys.executable, "-m", "modelward.cli.main", "guard", "check", str(cfg_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert cfg.defense.name in r.stdout and "2 key(s)" in r.stdout
    # a wrong override is a clear error naming the field and the choices, without a traceback
    r = subprocess.run([sys.executable, "-m", "modelward.cli.main", "guard", "check", str(cfg_path),
                        "--set", "defense.name=modelguard"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "valid choices" in r.stderr and "Traceback" not in r.stderr
    # in-process: the service answers with defended probabilities only
    svc = build_service(cfg_path, ["defense.params.epsilon=0.5"])
    x = torch.rand(3, *cfg.model.input_shape)
    y_hat, max_l1 = svc.answer(svc.keys["change-me-internal-key"], x)
    assert y_hat.shape == (3, 10) and max_l1 <= 0.5 + 1e-5
    svc.close()
