"""Fair under many slow clients (issue 37 item 5), against a real `guard serve` on 127.0.0.1: from 20 source
addresses × 30 idle connections a well-behaved client on another address got 503 for 67 % of its requests (the
connection cap was global, first come first served). Now idle and half-sent connections can only push each other
out (eviction from the fullest address first) and API keys keep a reserve; the flood here is 8 addresses × 8
connections, half idle and half sending a head that never ends, reopened as soon as the server closes them, against
a 32-connection server. Every socket has a timeout; every loop is bounded in time."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

from modelward.core.zoo import ModelConfig, build_model
from modelward.extraction.guard.process import start_guard_server, write_guard_config

pytestmark = pytest.mark.slow

KEY = "fairness-test-key-0"
SHAPE, K = (1, 4, 4), 5
ATTACKERS = [f"127.0.0.{10 + i}" for i in range(8)]
SERVER = {"max_connections": 32, "max_connections_per_client": 8, "reserved_connections": 8,
          "header_timeout_s": 10.0, "idle_timeout_s": 5.0, "body_timeout_s": 30.0, "shutdown_timeout_s": 2.0}


def _config(d: Path, **server: object) -> Path:
    cfg = ModelConfig(arch="mlp", hidden=[16])
    torch.manual_seed(0)
    return write_guard_config(d, build_model(cfg, SHAPE, K), cfg, SHAPE, K, defense="modelguard_s",
                              defense_params={"epsilon": 0.5}, keys={KEY: None}, name="tiny",
                              server={**SERVER, **server})


def _connect(url: str, source: str) -> socket.socket | None:
    host, port = url.removeprefix("http://").split(":")
    s = socket.socket()
    s.settimeout(2)
    try:
        s.bind((source, 0))
        s.connect((host, int(port)))
    except OSError:
        s.close()
        return None
    s.setblocking(False)
    return s


class Flood:
    """Hold ``per_source`` connections from each attacker address until stopped: even ones idle, odd ones sending
    a request head that never ends; a connection the server closes is reopened at once (bounded by ``stop``)."""

    def __init__(self, url: str, per_source: int = 8) -> None:
        self.url, self.per_source = url, per_source
        self.stop = threading.Event()
        self.reopened = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self, source: str, i: int) -> socket.socket | None:
        s = _connect(self.url, source)
        if s is not None and i % 2:
            try:
                s.send(b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\n")  # ... and never the blank line
            except OSError:
                pass
        return s

    def _run(self) -> None:
        socks = {(src, i): self._open(src, i) for src in ATTACKERS for i in range(self.per_source)}
        deadline = time.monotonic() + 60
        while not self.stop.is_set() and time.monotonic() < deadline:
            for slot, s in list(socks.items()):
                closed = s is None
                if s is not None:
                    try:
                        closed = s.recv(4096) == b""
                    except BlockingIOError:
                        closed = False
                    except OSError:
                        closed = True
                if closed:
                    if s is not None:
                        s.close()
                    socks[slot] = self._open(*slot)
                    self.reopened += 1
            time.sleep(0.05)
        for s in socks.values():
            if s is not None:
                s.close()

    def __enter__(self) -> Flood:
        self.thread.start()
        time.sleep(1.0)  # the flood is in place before the honest client starts (not a timing assertion)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


def _body(rows: int = 2) -> bytes:
    x = torch.rand(rows, *SHAPE, generator=torch.Generator().manual_seed(rows))
    return json.dumps({"inputs": [{"name": "input", "shape": [rows, *SHAPE], "datatype": "FP32",
                                   "data": x.flatten().tolist()}]}).encode()


def _honest(url: str, source: str, n: int, keep_alive: bool) -> list[int | str]:
    """``n`` requests with the key from ``source``: on one kept-alive connection, or a new connection each."""
    out: list[int | str] = []
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    if not keep_alive:
        headers["Connection"] = "close"
    transport = httpx.HTTPTransport(local_address=source, retries=0)
    with httpx.Client(transport=transport, timeout=20.0) as client:
        for _ in range(n):
            try:
                out.append(client.post(f"{url}/v2/models/tiny/infer", content=_body(), headers=headers).status_code)
            except httpx.HTTPError as e:
                out.append(type(e).__name__)
    return out


def test_a_key_holder_is_served_through_a_flood_and_no_request_in_progress_is_cut(tmp_path):
    """The flood: the key holder gets every answer, on a kept-alive connection and on a new connection per
    request, and the flood was pushed back (evictions). Then eviction never cuts a request in progress: 32
    connections each in the middle of a request body leave the 33rd a 503, and every one of them is answered."""
    with start_guard_server(_config(tmp_path)) as srv:
        with Flood(srv.url) as flood:
            kept = _honest(srv.url, "127.0.0.99", 12, keep_alive=True)
            fresh = _honest(srv.url, "127.0.0.98", 6, keep_alive=False)  # a new, unauthenticated connection each
            anonymous = httpx.get(f"{srv.url}/v2/health/ready", timeout=20.0).status_code
            reopened = flood.reopened
        log = srv.log_path.read_text(errors="replace")
        assert kept == [200] * 12, kept
        assert fresh == [200] * 6, fresh
        assert anonymous == 200
        assert reopened > 0 and "evicted" in log  # the flood was really at the limit, and was pushed back
        time.sleep(1.0)  # the flood's sockets are closed (a wait, not a timing assertion)

        body = _body()
        head = (f"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        busy: list[socket.socket] = []
        try:
            # in two waves: a key holder's connection counts as authenticated once its head has been read, so the
            # first 24 (the unauthenticated share) are read before the last 8 arrive
            for wave in (ATTACKERS[:3], ATTACKERS[3:4]):
                for src in wave:
                    for _ in range(8):
                        s = _connect(srv.url, src)
                        assert s is not None
                        s.setblocking(True)
                        s.settimeout(20)
                        s.sendall(head + body[:10])
                        busy.append(s)
                time.sleep(1.0)  # the server has read the heads (a wait, not a timing assertion)
            late = _connect(srv.url, "127.0.0.50")
            assert late is not None
            late.setblocking(True)
            late.settimeout(20)
            got = late.recv(4096)
            late.close()
            assert got.startswith(b"HTTP/1.1 503") and b"busy with a request" in got, got[:300]
            for s in busy:
                s.sendall(body[10:])
            answers = [s.recv(65536) for s in busy]
            assert all(a.startswith(b"HTTP/1.1 200") for a in answers), [a[:40] for a in answers]
        finally:
            for s in busy:
                s.close()
    assert "Traceback" not in srv.log_path.read_text(errors="replace")
