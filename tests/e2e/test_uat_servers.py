"""Acceptance checks found by hand: servers started on a port that is already taken fail cleanly."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

from modelward.core.config import load_config
from modelward.core.io import save_state_dict
from modelward.core.zoo import build_model
from modelward.extraction.guard.config import GuardConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_guard_serve_on_a_busy_port_is_a_clear_error(tmp_path):
    cfg_path = tmp_path / "guard.toml"
    shutil.copy(EXAMPLES / "guard_modelguard_s.toml", cfg_path)
    cfg = load_config(cfg_path, GuardConfig)
    model = build_model(cfg.model.net, tuple(cfg.model.input_shape), cfg.model.num_classes)
    save_state_dict(tmp_path / cfg.model.checkpoint, model.state_dict())
    with socket.socket() as s:  # the "first server"
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "modelward.cli.main", "guard", "serve", str(cfg_path),
                            "--port", str(port)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr and "Traceback" not in r.stderr
    assert "READY" not in r.stdout
