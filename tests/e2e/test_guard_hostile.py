"""Hostile requests against the real guarded service (a `guard serve` subprocess on 127.0.0.1).

One server answers malformed requests of every kind (4xx `{"error"}`, logged, still serving), the complete
Open Inference Protocol (server/model metadata with and without versions, `id` and `parameters` echoed, the binary
tensor extension, /openapi.json), an unmodified `tritonclient[http]` client, and concurrent over-spending of a
budget. A second group starts servers on one `state_dir`: a second server is refused naming the holder, a stale
lock is taken over, and a restart with another ε is refused unless `--reset`.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from modelward.core.lock import LockedError
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError
from modelward.extraction.guard.process import start_guard_server, write_guard_config
from modelward.extraction.guard.service import build_service

KEY, BUDGET_KEY = "hostile-key-unlimited", "hostile-key-budget-100"
SHAPE, K = (1, 4, 4), 5
H = {"Authorization": f"Bearer {KEY}"}
#: the shipped configuration: the answer watermark and the detector on, with their defaults (issue #37 item 6)
SHIPPED = {"watermark": {}, "detector": {}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    cfg = ModelConfig(arch="mlp", hidden=[16])
    torch.manual_seed(0)
    model = build_model(cfg, SHAPE, K)
    path = write_guard_config(d, model, cfg, SHAPE, K, defense="modelguard_s", defense_params={"epsilon": 0.5},
                              keys={KEY: None, BUDGET_KEY: 100}, name="tiny", ownership=SHIPPED,
                              server={"max_batch": 64, "max_body_bytes": 200_000})
    with start_guard_server(path) as srv:
        yield srv, d, model


def _body(x: torch.Tensor, **over) -> dict:
    t = {"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.flatten().tolist()}
    t.update(over)
    return {"inputs": [t]}


def _nested_with(x: torch.Tensor, value: object) -> list:
    nested = x.tolist()
    nested[1][0][2][3] = value
    return nested


def _post(url: str, content: bytes, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{url}/v2/models/tiny/infer", content=content,
                      headers={"Content-Type": "application/json", **H, **(headers or {})}, timeout=30)


def _log_codes(d: Path) -> dict[str, int]:
    db = sqlite3.connect(str(d / "guard_state" / "queries.sqlite"))
    try:
        return dict(db.execute("SELECT code, COUNT(*) FROM queries GROUP BY code").fetchall())
    finally:
        db.close()


def test_malformed_requests_get_4xx_errors_are_logged_and_server_stays_up(server):
    srv, d, _ = server
    url = srv.url
    x = torch.rand(2, *SHAPE)
    n = x.numel()
    before = _log_codes(d)
    cases = [
        ("[" * 100_000 + "]" * 100_000).encode(),  # RecursionError in json.loads: was an HTTP 500
        json.dumps({"inputs": [{"name": "input", "shape": [2, 1, 4, 4], "datatype": "FP32",
                                "data": [[[[[[[0.5]]]]]]] * n}]}).encode(),  # nested deeper than the shape
        json.dumps(_body(x, data=["0.5"] * n)).encode(),  # numeric strings are not FP32
        json.dumps(_body(x, data=[0.5] * (n - 1) + ["1"])).encode(),
        json.dumps(_body(x, data=_nested_with(x, True))).encode(),  # a boolean deep inside nested data
        json.dumps(_body(x, data=[0.1] * (n - 1) + [False])).encode(),
        json.dumps(_body(x, data=[None] * n)).encode(),
        json.dumps(_body(x, data=[0.1] * (n - 1) + [{"a": 1}])).encode(),
        json.dumps(_body(x, data=[10 ** 400] + [0.0] * (n - 1))).encode(),  # overflows FP32: inf
        json.dumps(_body(x, data=[[0.1] * 3, [0.2] * 29])).encode(),  # ragged
        json.dumps({"inputs": [{"name": "input", "shape": [2, 1, 4, True], "datatype": "FP32", "data": []}]}).encode(),
        json.dumps({"id": 5, **_body(x)}).encode(),
        json.dumps({"parameters": [1], **_body(x)}).encode(),
        json.dumps({"outputs": [{"name": "logits"}], **_body(x)}).encode(),  # only defended probabilities leave
        b"\xff\xfe not utf-8",
        b"",
    ]
    for body in cases:
        r = _post(url, body)
        assert 400 <= r.status_code < 500, (body[:80], r.status_code, r.text[:200])
        assert set(r.json()) == {"error", "code"} and r.json()["error"], r.text
    # oversized bodies: declared, and streamed without a Content-Length (chunked)
    big = b'{"inputs": [' + b" " * 300_000 + b"]}"
    assert _post(url, big).status_code == 413

    def chunks():
        for _ in range(40):
            yield b" " * 10_000

    r = httpx.post(f"{url}/v2/models/tiny/infer", content=chunks(), headers=H, timeout=30)
    assert r.status_code == 413 and "error" in r.json()
    # unknown routes and methods answer the protocol's error body, not FastAPI's {"detail"}
    for r in (httpx.get(f"{url}/v2/nope", timeout=5), httpx.delete(f"{url}/v2/models/tiny/infer", timeout=5),
              httpx.get(f"{url}/v2/models/tiny/versions/2", timeout=5)):
        assert r.status_code in (404, 405) and "error" in r.json() and "detail" not in r.json()
    # a correctly nested tensor is fine, and the server still answers
    ok = _post(url, json.dumps(_body(x, data=x.tolist())).encode())
    assert ok.status_code == 200, ok.text
    after = _log_codes(d)
    rejected = sum(after.values()) - sum(before.values()) - 1
    assert rejected == len(cases) + 2 + 3, sorted(after.items())  # every request is in the query log
    assert after.get("internal_error", 0) == 0


def test_open_inference_protocol_rest(server):
    srv, _, model = server
    url = srv.url
    meta = httpx.get(f"{url}/v2", timeout=5).json()
    assert meta["name"] and "version" in meta and "binary_tensor_data" in meta["extensions"]
    assert httpx.get(f"{url}/v2/health/live", timeout=5).status_code == 200
    for base in (f"{url}/v2/models/tiny", f"{url}/v2/models/tiny/versions/1"):
        assert httpx.get(base, timeout=5).json()["versions"] == ["1"]
        assert httpx.get(f"{base}/ready", timeout=5).json()["ready"] is True
    assert httpx.get(f"{url}/v2/models/tiny/versions/7/ready", timeout=5).status_code == 404
    x = torch.rand(3, *SHAPE)
    req = {"id": "req-42", "parameters": {"trace": "abc", "n": 3}, **_body(x)}
    r = httpx.post(f"{url}/v2/models/tiny/versions/1/infer", json=req, headers=H, timeout=5)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["id"] == "req-42" and out["parameters"] == {"trace": "abc", "n": 3}
    assert out["model_name"] == "tiny" and out["outputs"][0]["shape"] == [3, K]
    json_answer = np.array(out["outputs"][0]["data"], dtype=np.float32).reshape(3, K)
    # binary tensor extension: binary input, binary output requested per output
    head = json.dumps({"inputs": [{"name": "input", "shape": [3, *SHAPE], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 4 * x.numel()}}],
                       "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}]}).encode()
    blob = x.numpy().astype("<f4").tobytes()
    r = httpx.post(f"{url}/v2/models/tiny/infer", content=head + blob,
                   headers={**H, "Inference-Header-Content-Length": str(len(head))}, timeout=5)
    assert r.status_code == 200, r.text
    hl = int(r.headers["inference-header-content-length"])
    rhead = json.loads(r.content[:hl])
    assert rhead["outputs"][0]["parameters"]["binary_data_size"] == 4 * 3 * K
    bin_answer = np.frombuffer(r.content[hl:], dtype="<f4").reshape(3, K)
    assert np.array_equal(bin_answer, json_answer)  # ModelGuard-S: the same inputs get the same answers
    # a binary blob of the wrong size and a header length beyond the body are 400s
    for content, hlen in ((head + blob[:-4], len(head)), (head + blob, len(head) + len(blob) + 1)):
        r = httpx.post(f"{url}/v2/models/tiny/infer", content=content,
                       headers={**H, "Inference-Header-Content-Length": str(hlen)}, timeout=5)
        assert r.status_code == 400 and "error" in r.json()
    # the OpenAPI document lists every protocol route
    doc = httpx.get(f"{url}/openapi.json", timeout=5).json()
    paths = set(doc["paths"])
    assert {"/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/{name}", "/v2/models/{name}/ready",
            "/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}",
            "/v2/models/{name}/versions/{version}/ready", "/v2/models/{name}/versions/{version}/infer"} <= paths
    assert "requestBody" in doc["paths"]["/v2/models/{name}/infer"]["post"]


def test_unmodified_tritonclient(server):
    tc = pytest.importorskip("tritonclient.http")
    srv, _, model = server
    client = tc.InferenceServerClient(srv.url.removeprefix("http://"))
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.get_server_metadata()["name"]
        assert client.is_model_ready("tiny") and client.is_model_ready("tiny", "1")
        meta = client.get_model_metadata("tiny")
        assert meta["inputs"][0]["name"] == "input" and meta["outputs"][0]["name"] == "probabilities"
        x = np.random.default_rng(0).random((4, *SHAPE), dtype=np.float32)
        answers = []
        for binary in (True, False):
            inp = tc.InferInput("input", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=binary)
            outputs = None if binary else [tc.InferRequestedOutput("probabilities", binary_data=False)]
            # a copy: tritonclient adds Inference-Header-Content-Length to the dict it is given
            res = client.infer("tiny", [inp], outputs=outputs, request_id="t-1", headers=dict(H))
            assert res.get_response()["id"] == "t-1"
            answers.append(res.as_numpy("probabilities"))
        assert answers[0].shape == (4, K) and np.allclose(answers[0].sum(1), 1.0, atol=1e-5)
        assert np.array_equal(answers[0], answers[1])
        with torch.no_grad():
            clean = torch.softmax(model(torch.from_numpy(x)), 1).numpy()
        assert (answers[0].argmax(1) == clean.argmax(1)).all()
        with pytest.raises(Exception, match="unauthenticated|API key"):
            client.infer("tiny", [inp])  # no key
    finally:
        client.close()


def test_budget_cannot_be_overspent_by_concurrent_requests(server):
    srv, d, _ = server
    x = torch.rand(7, *SHAPE)
    body = json.dumps(_body(x)).encode()
    answered = []
    lock = threading.Lock()

    def spend() -> None:
        with httpx.Client(timeout=30) as c:
            for _ in range(6):
                r = c.post(f"{srv.url}/v2/models/tiny/infer", content=body,
                           headers={"Authorization": f"Bearer {BUDGET_KEY}", "Content-Type": "application/json"})
                assert r.status_code in (200, 429), r.text
                with lock:
                    answered.append(r.status_code == 200)

    threads = [threading.Thread(target=spend) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(answered) == 100 // 7  # 14 requests of 7 rows fit in 100 rows; all others are refused
    db = sqlite3.connect(str(d / "guard_state" / "queries.sqlite"))
    used = db.execute("SELECT used FROM usage WHERE key_name='key1'").fetchone()[0]
    db.close()
    assert used == 7 * sum(answered) <= 100


def test_a_second_server_on_the_same_state_dir_is_refused(server):
    srv, d, _ = server
    # a second service on the running server's state_dir (in this process: the lock is the same file) is refused,
    # naming the holder; the running server is unaffected
    with pytest.raises(LockedError, match=rf"pid {srv.proc.pid} on host"):
        build_service(d / "guard.toml")
    assert httpx.get(f"{srv.url}/v2/health/ready", timeout=5).status_code == 200


def test_settings_are_pinned_and_stale_locks_taken_over(tmp_path):
    cfg = ModelConfig(arch="mlp", hidden=[16])
    torch.manual_seed(0)
    model = build_model(cfg, SHAPE, K)
    path = write_guard_config(tmp_path, model, cfg, SHAPE, K, defense="modelguard_s",
                              defense_params={"epsilon": 0.1}, keys={KEY: None}, name="tiny", ownership=SHIPPED)
    x = torch.rand(60, *SHAPE, generator=torch.Generator().manual_seed(3))

    def answer(svc) -> torch.Tensor:  # noqa: ANN001
        return svc.answer(svc.keys[KEY], x)[0]

    svc = build_service(path)
    first = answer(svc)
    svc.close()
    # a stale lock (its process is gone) is taken over
    lock = tmp_path / "guard_state" / ".guard.lock"
    lock.write_text(json.dumps({"pid": _dead_pid(), "host": socket.gethostname(), "started": 0}))
    # a different ε with the old centroids is refused, naming the change and --reset
    with pytest.raises(ConfigError, match=r"epsilon: 0\.1 -> 0\.3.*--reset"):
        build_service(path, ["defense.params.epsilon=0.3"])
    svc = build_service(path)  # same settings: the saved centroids are reloaded, the same answers
    assert torch.equal(answer(svc), first)
    svc.close()
    svc = build_service(path, ["defense.params.epsilon=0.3"], reset=True)  # --reset: a new state
    assert svc.defense.num_centroids == 0
    svc.close()
    state = json.loads((tmp_path / "guard_state" / "service.json").read_text())
    assert state["defense"]["params"]["epsilon"] == 0.3
    assert not lock.exists()


def _dead_pid() -> int:
    pid = 4_000_000
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 1


def test_accepted_connections_have_tcp_nodelay():
    """Without TCP_NODELAY every response on a reused connection waited for the client's delayed ACK (~40 ms)."""
    from modelward.extraction.guard.http import bind_socket

    lsock = bind_socket("127.0.0.1", 0)
    try:
        assert lsock.proto == socket.IPPROTO_TCP  # asyncio sets TCP_NODELAY on accepted sockets only for proto TCP
        with socket.create_connection(lsock.getsockname()[:2]) as client:
            conn, _ = lsock.accept()
            with conn:
                assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
                assert client.fileno() >= 0
    finally:
        lsock.close()


def test_centroids_persist_incrementally_and_survive_a_crash(tmp_path):
    """ModelGuard-S centroids go to SQLite as they appear; a service that dies without its shutdown snapshot
    (kill -9) restarts with every centroid, so earlier answers never change."""
    cfg = ModelConfig(arch="mlp", hidden=[16])
    torch.manual_seed(0)
    model = build_model(cfg, SHAPE, K)
    path = write_guard_config(tmp_path, model, cfg, SHAPE, K, defense="modelguard_s",
                              defense_params={"epsilon": 0.05}, keys={KEY: None}, name="tiny", ownership=SHIPPED)
    g = torch.Generator().manual_seed(5)
    xs = [torch.rand(20, *SHAPE, generator=g) * 4 for _ in range(3)]
    svc = build_service(path)
    first = [svc.answer(svc.keys[KEY], x)[0] for x in xs[:2]]
    svc.close()  # clean shutdown: snapshot written
    svc = build_service(path)
    n_snapshot = svc.defense.num_centroids
    first.append(svc.answer(svc.keys[KEY], xs[2])[0])  # adds centroids after the snapshot
    n_all = svc.defense.num_centroids
    assert n_all > n_snapshot > 0
    svc._closed = True  # simulate a crash: no shutdown snapshot, only the lock is dropped
    svc.log.close()
    svc._folder_lock.release()
    svc = build_service(path)
    assert svc.defense.num_centroids == n_all
    again = [svc.answer(svc.keys[KEY], x)[0] for x in xs]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    svc.close()
    svc = build_service(path, reset=True)  # --reset clears the snapshot and the rows
    assert svc.defense.num_centroids == 0
    svc.close()
