"""Proxy mode's upstream client (issue 40 item 1) against a real HTTP(S) server on 127.0.0.1 in this process (a
threaded ``http.server`` answering Open Inference Protocol bodies, switched between behaviours): logits and
probabilities, kept-alive connections, every failure as its own error (nothing is charged), TLS and mutual TLS,
the metadata check, and the service answering through it."""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch

from modelward.extraction.guard.config import UpstreamSection
from modelward.extraction.guard.errors import GuardError
from modelward.extraction.guard.proxy import UpstreamClient, UpstreamModel, check_metadata, prefetched

K = 4


class Upstream:
    """A model server whose answer is ``behaviour``: logits, probs, badsum, nan, shape, error, slow, close."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.behaviour, self.connections, self.requests = "logits", 0, []
        self.hosts: list[str | None] = []
        self.open: list = []  # the connections' sockets: a stopped server closes them, as a dead one would
        up = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                up.connections += 1
                up.open.append(self.connection)

            def log_message(self, *a: object) -> None:
                pass

            def _send(self, status: int, doc: object) -> None:
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                if self.path.endswith("/ready"):
                    return self._send(200, {"ready": True})
                self._send(200, {"name": "m", "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 2]}],
                                 "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, K]}]})

            def do_POST(self) -> None:  # noqa: N802
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                up.requests.append((self.headers.get("Authorization"), req))
                up.hosts.append(self.headers.get("Host"))
                x = np.asarray(req["inputs"][0]["data"], dtype=np.float32).reshape(req["inputs"][0]["shape"])
                logits = np.stack([x.sum(1), -x.sum(1), x[:, 0], np.zeros(len(x))], 1).astype(np.float32)
                b = up.behaviour
                if b == "slow":
                    time.sleep(1.5)
                if b == "error":
                    return self._send(500, {"error": "CUDA out of memory at /secret/path"})
                if b == "close":
                    self.close_connection = True
                    return
                out = logits
                if b in ("probs", "badsum"):
                    e = np.exp(logits - logits.max(1, keepdims=True))
                    out = e / e.sum(1, keepdims=True) * (1.5 if b == "badsum" else 1.0)
                if b == "nan":
                    out = out.copy()
                    out[0, 0] = np.nan
                shape = list(out.shape) if b != "shape" else [len(out) + 1, K]
                data = [None if np.isnan(v) else float(v) for v in out.reshape(-1)]
                self._send(200, {"model_name": "m", "outputs": [{"name": "logits", "datatype": "FP32",
                                                                  "shape": shape, "data": data}]})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.handle_error = lambda *a: None  # a client that gave up (the slow case): not the test's failure
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        for sock in self.open:
            try:
                sock.shutdown(2)
            except OSError:
                pass


@pytest.fixture()
def upstream():
    up = Upstream()
    yield up
    up.close()


def _client(port: int, scheme: str = "http", tmp: Path | None = None, **kw: object) -> UpstreamClient:
    cfg = UpstreamSection(url=f"{scheme}://127.0.0.1:{port}", model="m", timeout_s=1.0, **kw)
    return UpstreamClient(cfg, tmp or Path("."))


X = torch.tensor([[0.5, 1.0], [2.0, -1.0], [0.0, 0.0]])


def _want_logits() -> np.ndarray:
    x = X.numpy()
    return np.stack([x.sum(1), -x.sum(1), x[:, 0], np.zeros(3)], 1).astype(np.float32)


def test_logits_and_probabilities_come_back_as_the_services_softmax_expects(upstream, monkeypatch):
    monkeypatch.setenv("UPSTREAM_TOKEN_FOR_TEST", "s3cret-token")
    client = _client(upstream.port, token_env="UPSTREAM_TOKEN_FOR_TEST")

    async def three() -> list[np.ndarray]:
        return [await client.infer(X) for _ in range(3)]

    outs = asyncio.run(three())
    assert all(np.array_equal(o, _want_logits()) for o in outs)  # FP32 through JSON: exact
    assert upstream.connections == 1  # one kept-alive connection for the three requests
    assert upstream.requests[0][0] == "Bearer s3cret-token"
    hosted = _client(upstream.port, host_header="digits.models.example.org")  # an ingress that routes by host
    asyncio.run(hosted.infer(X))
    assert upstream.hosts[-1] == "digits.models.example.org"
    assert upstream.requests[0][1]["inputs"][0]["shape"] == [3, 2]
    upstream.behaviour = "probs"
    probs_client = _client(upstream.port, output="probs")
    p = asyncio.run(probs_client.infer(X))
    back = torch.softmax(probs_client.to_logits(p), 1)
    # log then softmax: the upstream's float32 probabilities within a few float32 ulps (exp∘log rounding)
    assert torch.allclose(back, torch.from_numpy(p), rtol=0, atol=4 * float(np.finfo(np.float32).eps))
    assert torch.allclose(back, torch.softmax(torch.from_numpy(_want_logits()), 1), atol=1e-6)


@pytest.mark.parametrize(("behaviour", "code"), [("badsum", "upstream_bad_output"), ("nan", "upstream_bad_output"),
                                                 ("shape", "upstream_bad_output"), ("error", "upstream_error"),
                                                 ("close", "upstream_error"), ("slow", "upstream_timeout")])
def test_every_upstream_failure_is_its_own_error(upstream, behaviour, code, caplog):
    upstream.behaviour = behaviour
    client = _client(upstream.port, output="probs" if behaviour == "badsum" else "logits")
    with pytest.raises(GuardError) as e:
        asyncio.run(client.infer(X))
    assert e.value.code == code and "nothing was charged" in e.value.message, e.value.message
    if behaviour == "error":  # the upstream's details go to the operator's log, not to the client
        assert "/secret/path" not in e.value.message and "/secret/path" in caplog.text


def test_an_unreachable_upstream_is_unavailable_and_the_sync_path_agrees(upstream):
    port = upstream.port
    upstream.close()
    client = _client(port)
    with pytest.raises(GuardError) as e:
        asyncio.run(client.infer(X))
    assert e.value.code == "upstream_unavailable"
    with pytest.raises(GuardError) as e:
        client.infer_sync(X)
    assert e.value.code == "upstream_unavailable"
    assert asyncio.run(client.ready()) is False


def test_metadata_disagreements_are_named():
    cfg = UpstreamSection(url="http://127.0.0.1:1", model="m")
    meta = {"inputs": [{"name": "input", "shape": [-1, 1, 8, 8]}], "outputs": [{"name": "logits", "shape": [-1, 10]}]}
    assert check_metadata(meta, cfg, (1, 8, 8), 10) == []
    problems = check_metadata(meta, cfg, (1, 4, 4), 5)
    assert len(problems) == 2 and "[-1, 1, 4, 4]" in problems[0] and "[-1, 5]" in problems[1]
    named = UpstreamSection(url="http://127.0.0.1:1", model="m", input_name="x", output_name="probs")
    assert [p.split(" (")[0] for p in check_metadata(meta, named, (1, 8, 8), 10)] == [
        "the upstream has no input 'x'", "the upstream has no output 'probs'"]


# Both TLS versions, because they refuse a missing client certificate at different points: TLS 1.2 inside the
# handshake (the guard's connect fails), TLS 1.3 after the client's side of the handshake has ended (the alert
# TLSV13_ALERT_CERTIFICATE_REQUIRED arrives on the first read of the answer, or the server has already closed the
# connection: which one depends on timing). Either way the guard must answer a GuardError, never leak ssl.SSLError.
@pytest.mark.parametrize("version", ["TLSv1_2", "TLSv1_3"])
def test_tls_and_mutual_tls_to_the_upstream(tmp_path, version):
    from modelward.governance.trust.certs import make_certs

    paths = make_certs(tmp_path, ["upstream", "guard"], hosts=["127.0.0.1"])
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ctx.maximum_version = getattr(ssl.TLSVersion, version)
    ctx.load_cert_chain(paths["upstream"], tmp_path / "upstream.key")
    ctx.load_verify_locations(paths["ca"])
    ctx.verify_mode = ssl.CERT_REQUIRED  # mutual TLS: the guard must show its certificate
    up = Upstream(tls=ctx)
    try:
        ok = _client(up.port, "https", tmp_path, ca="ca.pem", cert="guard.pem", key="guard.key")
        assert np.array_equal(asyncio.run(ok.infer(X)), _want_logits())
        assert np.array_equal(ok.infer_sync(X), _want_logits())
        for kw in ({}, {"ca": "ca.pem"}):  # the system's CAs do not know ours; no client certificate
            refused = _client(up.port, "https", tmp_path, **kw)
            with pytest.raises(GuardError) as e:
                asyncio.run(refused.infer(X))
            # upstream_error only where the server closed before the alert could be read (TLS 1.3, timing)
            assert e.value.code in ("upstream_unavailable", "upstream_error"), e.value.message
            with pytest.raises(GuardError) as e:
                refused.infer_sync(X)
            assert e.value.code in ("upstream_unavailable", "upstream_error"), e.value.message
        assert np.array_equal(asyncio.run(ok.infer(X)), _want_logits())  # the refusals were of those clients only
    finally:
        up.close()


def test_the_model_answers_from_the_prefetched_answer_or_asks_itself(upstream):
    model = UpstreamModel(UpstreamSection(url=f"http://127.0.0.1:{upstream.port}", model="m"), Path("."), (2,), K)
    assert model.check() == []
    fake = torch.full((3, K), 7.0)
    with prefetched(X.clone(), fake):  # the service parses the body again: an equal tensor, not the same one
        assert torch.equal(model(X), fake) and model.calls == 0
    assert torch.equal(model(X), torch.from_numpy(_want_logits())) and model.calls == 1
    model.close()
