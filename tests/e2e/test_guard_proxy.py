"""Proxy mode over HTTP (issue 40 item 1), a real `guard serve` subprocess in front of a model server in this
process: the upstream's failures are 502/503/504 answers that charge nothing and are logged, readiness follows the
upstream, and a config with both weights and an upstream, or an upstream serving another shape, is refused.
(The extraction-defense checks run in both modes in tests/e2e/test_guard_service.py.)"""

from __future__ import annotations

import json
import sqlite3

import httpx
import pytest

from modelward.core.zoo import ModelConfig
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


def test_upstream_failures_charge_nothing_and_readiness_follows_the_upstream(tmp_path):
    up = Upstream()
    try:
        with start_guard_server(_config(tmp_path, up.port)) as srv:
            ok = _infer(srv.url)
            assert ok.status_code == 200 and ok.json()["outputs"][0]["shape"] == [2, 4]
            for behaviour, status, code in (("error", 502, "upstream_error"), ("nan", 502, "upstream_bad_output"),
                                            ("slow", 504, "upstream_timeout")):
                up.behaviour = behaviour
                r = _infer(srv.url)
                assert (r.status_code, r.json()["code"]) == (status, code), r.text
            up.behaviour = "logits"
            assert httpx.get(f"{srv.url}/v2/health/ready", timeout=20).status_code == 200
            up.close()
            r = _infer(srv.url)
            assert (r.status_code, r.json()["code"]) == (503, "upstream_unavailable"), r.text
            assert httpx.get(f"{srv.url}/v2/health/ready", timeout=20).status_code == 503
            assert httpx.get(f"{srv.url}/v2/health/live", timeout=20).status_code == 200
    finally:
        up.close()
    db = sqlite3.connect(str(tmp_path / "guard_state" / "queries.sqlite"))
    try:
        used = db.execute("SELECT used FROM usage WHERE key_name='key0'").fetchone()[0]
        codes = dict(db.execute("SELECT code, status FROM queries").fetchall())
    finally:
        db.close()
    assert used == 2  # the one answered request; the failed ones were not charged
    assert codes["upstream_timeout"] == 504 and codes["upstream_unavailable"] == 503


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
