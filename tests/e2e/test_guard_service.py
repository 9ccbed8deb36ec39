"""The guarded prediction service over real HTTP on 127.0.0.1 (subprocess server, bounded requests), in direct mode
(the guard loads the weights) and in proxy mode (issue 40 item 1: the guard in front of a model server that holds
the weights — a second `guard serve` with no defense answering probabilities, and a KServe ModelServer answering
logits): the same extraction-defense checks for each."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import httpx
import pytest
import torch

from modelward.core.zoo import ModelConfig, build_model
from modelward.extraction.defenses import make_defense
from modelward.extraction.defenses.base import is_in_simplex, l1_distortion
from modelward.extraction.guard.process import (
    KSERVE_PYTHON,
    start_guard_server,
    start_kserve_model,
    write_guard_config,
)
from modelward.extraction.victim import HttpVictim, LocalVictim, QueryBudgetExceeded, VictimError

KEY, SMALL_KEY, UPSTREAM_KEY = "test-key-unlimited", "test-key-budget-20", "upstream-key-of-the-proxy"
SHAPE, K = (1, 4, 4), 5
TOKEN_ENV = "MODELWARD_TEST_UPSTREAM_TOKEN"


# proxy mode in front of KServe when its environment exists, else in front of a second `guard serve` (which
# tests/e2e/test_guard_proxy.py also stands in front of): one proxy run per environment (test-time budget)
PROXY = "proxy-kserve" if KSERVE_PYTHON.is_file() else "proxy-guard"


@pytest.fixture(scope="module", params=["direct", pytest.param(PROXY, marks=pytest.mark.slow)])
def setup(request, tmp_path_factory):
    """(state folder, the guard's config, the model, the guard's environment) for each mode; proxy modes start the
    upstream (with the same weights) for the module."""
    mode = request.param
    d = tmp_path_factory.mktemp(f"guard-{mode}")
    cfg = ModelConfig(arch="mlp", hidden=[16])
    torch.manual_seed(0)
    model = build_model(cfg, SHAPE, K)
    guard = {"defense": "modelguard_s", "defense_params": {"epsilon": 0.5}, "keys": {KEY: None, SMALL_KEY: 20},
             "name": "tiny", "server": {"max_batch": 32, "max_body_bytes": 20000}}
    if mode == "direct":
        yield d, write_guard_config(d, model, cfg, SHAPE, K, **guard), model, {}
        return
    up = d / "upstream"  # the weights live here, never in the proxy's folder
    if mode == "proxy-guard":
        upstream = start_guard_server(write_guard_config(up, model, cfg, SHAPE, K, defense="none",
                                                         keys={UPSTREAM_KEY: None}, name="tiny-up"))
        table, env = {"url": upstream.url, "model": "tiny-up", "output": "probs", "token_env": TOKEN_ENV}, {
            TOKEN_ENV: UPSTREAM_KEY}
    else:
        write_guard_config(up, model, cfg, SHAPE, K)  # (only for its checkpoint)
        upstream = start_kserve_model(up / "model.safetensors", "tiny-up", SHAPE, K, output="logits")
        table, env = {"url": upstream.url, "model": "tiny-up", "output": "logits"}, {}
    path = write_guard_config(d, None, cfg, SHAPE, K, upstream=table, **guard)
    assert not (d / "model.safetensors").exists()
    with upstream:
        yield d, path, model, env


def _payload(x: torch.Tensor, **over) -> dict:
    t = {"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.flatten().tolist()}
    t.update(over)
    return {"inputs": [t]}


def test_service_end_to_end(setup):
    d, path, model, env = setup
    x = torch.rand(40, *SHAPE, generator=torch.Generator().manual_seed(1))
    with start_guard_server(path, env=env) as server:
        url, h = server.url, {"Authorization": f"Bearer {KEY}"}
        assert httpx.get(f"{url}/v2/health/ready", timeout=5).json() == {"ready": True}
        meta = httpx.get(f"{url}/v2/models/tiny", timeout=5).json()
        assert meta["outputs"][0]["shape"] == [-1, K] and meta["parameters"]["defense"] == "modelguard_s"
        # happy path through the client: batches split by max_batch, answers are defended probabilities
        with HttpVictim(url, "tiny", KEY) as victim:
            ans = victim.query(x)
            assert ans.shape == (40, K) and victim.queries_used == 40 and victim.batch_size == 32
        with torch.no_grad():
            clean = torch.softmax(model(x), 1)
        assert is_in_simplex(ans).all()
        assert (ans.argmax(1) == clean.argmax(1)).all()
        assert float(l1_distortion(clean, ans).max()) <= 0.5 + 1e-5
        assert not torch.allclose(ans, clean, atol=1e-4)  # the defense did perturb something
        # same answers as a local ModelGuard-S fed the same stream
        local_defense = make_defense("modelguard_s", epsilon=0.5)
        local = LocalVictim(model, local_defense, batch_size=32).query(x)
        assert torch.allclose(ans, local, atol=1e-6)
        # bad requests get 4xx JSON errors, and the server keeps serving
        bad = [
            (_payload(x[:2]), {}, 401),
            (_payload(x[:2]), {"Authorization": "Bearer wrong-key-123"}, 401),
            (_payload(x[:2], datatype="FP64"), h, 400),
            (_payload(x[:2], shape=[2, 1, 4, 5]), h, 400),
            (_payload(x[:2], data=[0.1] * 3), h, 400),
            (_payload(x[:2], data=[math.nan] + [0.0] * 31), h, 400),
            (_payload(x[:2], data=[True] + [0.0] * 31), h, 400),  # a boolean is not an FP32 number
            (_payload(x[:2], name="logits"), h, 400),
            ({"inputs": "nope"}, h, 400),
            (_payload(torch.rand(33, *SHAPE)), h, 413),
        ]
        for payload, headers, status in bad:
            r = httpx.post(f"{url}/v2/models/tiny/infer", content=json.dumps(payload).encode(),  # allows NaN
                           headers={"Content-Type": "application/json", **headers}, timeout=5)
            assert r.status_code == status, (payload.get("inputs"), r.text)
            assert "error" in r.json()
        r = httpx.post(f"{url}/v2/models/tiny/infer", content=b"{not json", headers=h, timeout=5)
        assert r.status_code == 400
        r = httpx.post(f"{url}/v2/models/tiny/infer", content=b"x" * 30000, headers=h, timeout=5)
        assert r.status_code == 413
        assert httpx.post(f"{url}/v2/models/other/infer", json=_payload(x[:1]), headers=h, timeout=5).status_code == 404
        # budgets: 20 rows for the small key, then a specific error; nothing partial is answered
        with HttpVictim(url, "tiny", SMALL_KEY) as v:
            v.query(x[:15])
            with pytest.raises(QueryBudgetExceeded):
                v.query(x[:10])
            v.query(x[:5])
            with pytest.raises(QueryBudgetExceeded):
                v.query(x[:1])
        with pytest.raises(VictimError):
            HttpVictim(url, "nope", KEY)
        # still serving after all of that, and deterministic for repeated queries
        with HttpVictim(url, "tiny", KEY) as victim:
            assert torch.equal(victim.query(x), ans)
        if not (d / "model.safetensors").exists():  # proxy modes: what follows (kill -9, restart, persistence) is
            return  # the service's own state, the same in both modes: tested in direct mode (test-time budget)
        server.proc.kill()  # kill -9: no shutdown snapshot
        server.proc.wait(10)
    # every centroid was persisted as it appeared (SQLite), so a crash loses none
    n = local_defense.num_centroids
    db = sqlite3.connect(str(Path(d) / "guard_state" / "queries.sqlite"))
    assert db.execute("SELECT COUNT(*), MAX(seq) FROM centroids_tiny_modelguard_s").fetchone() == (n, n - 1)
    db.close()
    # restart: ModelGuard-S centroids and budgets persist
    with start_guard_server(path, env=env) as server, HttpVictim(server.url, "tiny", KEY) as victim:
        assert torch.equal(victim.query(x), ans)
        with HttpVictim(server.url, "tiny", SMALL_KEY) as v, pytest.raises(QueryBudgetExceeded):
            v.query(x[:1])
    state = next((d / "guard_state").glob("*.state.safetensors"))  # the graceful stop wrote the snapshot
    from modelward.core.io import load_tensors

    assert load_tensors(state)["centroids"].shape[0] == n
    # every request was logged, answered or not
    db = sqlite3.connect(str(Path(d) / "guard_state" / "queries.sqlite"))
    codes = dict(db.execute("SELECT code, COUNT(*) FROM queries GROUP BY code").fetchall())
    db.close()
    assert codes["ok"] >= 8 and codes["unauthenticated"] == 2 and codes["query_budget_exceeded"] == 3
    assert codes["bad_shape"] == 2 and codes["batch_too_large"] == 1
