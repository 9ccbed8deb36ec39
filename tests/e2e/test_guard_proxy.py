"""Proxy mode over HTTP (issue 40 item 1), a real `guard serve` in front of a second `guard serve`: the upstream's
failures are 502/503 answers that charge nothing and are logged, readiness follows the upstream; a config with both
weights and an upstream, or an upstream serving another shape, is refused. (Each failure of the upstream client:
tests/extraction/test_guard_proxy.py; the extraction-defense checks in both modes: tests/e2e/test_guard_service.py.)"""

from __future__ import annotations

import json
import sqlite3

import httpx
import pytest
import torch

from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError
from modelward.extraction.guard.config import load_guard_config
from modelward.extraction.guard.process import start_guard_server, write_guard_config


def _upstream_class() -> type:
    """The in-process model server of tests/extraction/test_guard_proxy.py (test folders are not packages here)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "_guard_proxy_upstream", Path(__file__).resolve().parents[1] / "extraction" / "test_guard_proxy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Upstream


Upstream = _upstream_class()

pytestmark = pytest.mark.slow
KEY = "proxy-e2e-key-0"


def _config(d, port: int, **upstream: object):
    return write_guard_config(d, None, ModelConfig(arch="mlp", hidden=[4]), (2,), 4, keys={KEY: 100}, name="m",
                              upstream={"url": f"http://127.0.0.1:{port}", "model": "m", "timeout_s": 1.0,
                                        **upstream}, server={"max_batch": 8})


def _infer(url: str) -> httpx.Response:
    body = {"inputs": [{"name": "input", "shape": [2, 2], "datatype": "FP32", "data": [0.5, 1.0, 2.0, -1.0]}]}
    return httpx.post(f"{url}/v2/models/m/infer", content=json.dumps(body).encode(), timeout=20,
                      headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})


def test_in_front_of_a_second_guard_failures_charge_nothing_and_readiness_follows_the_upstream(tmp_path):
    """The upstream is a real `guard serve` (no defense, probabilities, its own key from the environment); when it
    answers an error, and when it is gone, the proxy answers 502 / 503, charges nothing, logs the refusal, and says
    not ready (while alive)."""
    up_dir = tmp_path / "upstream"
    cfg = ModelConfig(arch="mlp", hidden=[4])
    torch.manual_seed(0)
    up_cfg = write_guard_config(up_dir, build_model(cfg, (2,), 4), cfg, (2,), 4, defense="none",
                                keys={"upstream-key-of-the-proxy": 5}, name="m")  # room for 2 requests of 2 rows
    env = {"UPSTREAM_TOKEN_E2E": "upstream-key-of-the-proxy"}
    with start_guard_server(up_cfg) as upstream:
        path = _config(tmp_path / "proxy", 0, output="probs", token_env="UPSTREAM_TOKEN_E2E")
        path.write_text(path.read_text().replace("http://127.0.0.1:0", upstream.url))
        with start_guard_server(path, env=env) as srv:
            for _ in range(2):
                ok = _infer(srv.url)
                assert ok.status_code == 200 and ok.json()["outputs"][0]["shape"] == [2, 4], ok.text
            r = _infer(srv.url)  # the upstream's own budget for the proxy is spent: its 429 is the proxy's 502
            assert (r.status_code, r.json()["code"]) == (502, "upstream_error"), r.text
            assert httpx.get(f"{srv.url}/v2/health/ready", timeout=20).status_code == 200
            upstream.stop()
            r = _infer(srv.url)
            assert (r.status_code, r.json()["code"]) == (503, "upstream_unavailable"), r.text
            assert httpx.get(f"{srv.url}/v2/health/ready", timeout=20).status_code == 503
            assert httpx.get(f"{srv.url}/v2/health/live", timeout=20).status_code == 200
    db = sqlite3.connect(str(tmp_path / "proxy" / "guard_state" / "queries.sqlite"))
    try:
        used = db.execute("SELECT used FROM usage WHERE key_name='key0'").fetchone()[0]
        codes = dict(db.execute("SELECT code, status FROM queries").fetchall())
    finally:
        db.close()
    assert used == 4  # the two answered requests; the failed ones were not charged
    assert codes["upstream_error"] == 502 and codes["upstream_unavailable"] == 503
    assert "upstream-key-of-the-proxy" not in path.read_text()  # the upstream's key stays in the environment


def test_a_config_names_weights_or_an_upstream_and_the_upstream_must_fit(tmp_path, capsys):
    from modelward.cli.main import main

    path = _config(tmp_path, 1)
    text = path.read_text().replace('[model]\n', '[model]\ncheckpoint = "model.safetensors"\n')
    (tmp_path / "both.toml").write_text(text)
    with pytest.raises(ConfigError, match="exclude each other"):
        load_guard_config(tmp_path / "both.toml")
    up = Upstream()  # its metadata says 2 inputs and 4 classes
    try:
        bad = write_guard_config(tmp_path / "bad", None, ModelConfig(arch="mlp", hidden=[4]), (3,), 4,
                                 keys={KEY: None}, name="m", upstream={"url": f"http://127.0.0.1:{up.port}",
                                                                       "model": "m"})
        with pytest.raises(SystemExit) as e:
            main(["guard", "serve", str(bad), "--port", "0"])
        err = " ".join(capsys.readouterr().err.split())
        assert e.value.code == 2 and "does not serve what [model] says" in err and "[-1, 3]" in err, err
    finally:
        up.close()
