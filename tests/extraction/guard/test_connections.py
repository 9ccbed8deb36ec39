"""The connection limits on both HTTP/1.1 protocols the guard can run (guard-perf3: the compiled httptools parser by
default, h11 as the fallback): a slow request head is closed, an oversized one refused, the per-client cap holds,
and a normal request on a kept-alive connection is answered — against a real uvicorn server on 127.0.0.1 in a
thread, with short timeouts. Every socket has a timeout."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from modelward.errors import ConfigError
from modelward.extraction.guard.connections import (
    ConnectionLimits,
    event_loop,
    http_implementation,
    limited_protocol,
)

IMPLS = ["h11", pytest.param("httptools", marks=pytest.mark.skipif(
    http_implementation("auto") != "httptools", reason="httptools is not installed"))]


async def _app(scope, receive, send):
    if scope["type"] != "http":
        return
    if scope["path"] == "/early":  # answers without reading its body (as a 413 for a declared oversized body)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
        await send({"type": "http.response.body", "body": b"early"})
        return
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    out = b"got %d bytes" % len(body)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(out)).encode())]})
    await send({"type": "http.response.body", "body": out})


@pytest.fixture(params=IMPLS)
def server(request):
    import uvicorn

    limits = ConnectionLimits(header_timeout=0.6, body_timeout=0.6, idle_timeout=5.0, max_per_client=3,
                              max_total=16, reserve=2, check_every=0.1, max_head_bytes=4096)
    proto = limited_protocol(limits, request.param)
    assert proto.implementation == request.param
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    srv = uvicorn.Server(uvicorn.Config(_app, log_level="error", http=proto, lifespan="off",
                                        loop=event_loop("auto")))
    t = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert srv.started
    yield sock.getsockname()[1], proto
    srv.should_exit = True
    t.join(10)
    sock.close()


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    return s


def _read_all(s: socket.socket) -> bytes:
    out = b""
    while True:
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        out += chunk
    return out


def _request(body: bytes = b"abc", extra: bytes = b"") -> bytes:
    return (b"POST /x HTTP/1.1\r\nhost: t\r\n" + extra + b"content-length: " + str(len(body)).encode()
            + b"\r\n\r\n" + body)


def _response(s: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(4096)
    head, _, rest = data.partition(b"\r\n\r\n")
    n = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")))
    while len(rest) < n:
        rest += s.recv(4096)
    return head + b"\r\n\r\n" + rest


def test_kept_alive_requests_are_answered_with_a_body_in_the_same_read_and_after(server):
    port, _ = server
    with _connect(port) as s:
        for body in (b"abc", b"x" * 20000, b""):  # a body larger than the head cap is not a head
            s.sendall(_request(body))
            resp = _response(s)
            assert resp.startswith(b"HTTP/1.1 200") and resp.endswith(b"got %d bytes" % len(body))


def test_a_slow_request_head_is_closed_after_the_header_timeout(server):
    port, _ = server
    with _connect(port) as s:
        t0 = time.monotonic()
        s.sendall(b"POST /x HTTP/1.1\r\nhost: t\r\n")  # never completed
        assert _read_all(s) == b""
        assert 0.5 <= time.monotonic() - t0 < 4.0


def test_an_oversized_request_head_is_refused_and_never_reaches_the_app(server):
    port, proto = server
    # a head that arrives whole in one read: httptools counts what it parsed (h11 accepts it: one read at most)
    for extra in () if proto.implementation == "h11" else (b"x-big: " + b"a" * 6000 + b"\r\n",  # one long header, in one read with the whole request
                  b"".join(b"x-h%d: %s\r\n" % (i, b"b" * 100) for i in range(60))):  # many headers
        with _connect(port) as s:
            s.sendall(_request(b"abc", extra))
            resp = _read_all(s)
            assert resp.startswith(b"HTTP/1.1 431") and b"head_too_large" in resp, resp[:100]
            assert b"got " not in resp  # the app never ran
    with _connect(port) as s:  # a head that never ends, sent in pieces, is cut at the cap (before the timeout)
        s.sendall(b"POST /x HTTP/1.1\r\nhost: t\r\n")
        t0 = time.monotonic()
        try:
            for _ in range(20):
                s.sendall(b"x-slow: " + b"c" * 500 + b"\r\n")
                time.sleep(0.005)
        except (BrokenPipeError, ConnectionResetError):
            pass
        resp = _read_all(s)
        assert time.monotonic() - t0 < 0.5  # not the header timeout (0.6 s)
        assert resp.startswith(b"HTTP/1.1 431") and b"got " not in resp, resp[:100]
    with _connect(port) as s:  # and the server still serves
        s.sendall(_request())
        assert _response(s).endswith(b"got 3 bytes")


def test_a_body_still_arriving_after_its_answer_is_not_taken_for_a_request_head(server):
    port, _ = server
    with _connect(port) as s:
        s.sendall(b"POST /early HTTP/1.1\r\nhost: t\r\ncontent-length: 60000\r\n\r\n" + b"x" * 20000)
        assert _response(s).endswith(b"early")
        try:
            s.sendall(b"y" * 40000)  # the rest of the body (over the head cap), read on its own
            time.sleep(0.3)
            s.sendall(_request())  # then a request
            resp = _read_all_or_first(s)
        except (BrokenPipeError, ConnectionResetError):
            resp = b""
        # httptools keeps the connection and answers the next request; h11 closes it after an early answer
        assert resp == b"" or resp.endswith(b"got 3 bytes"), resp[:100]
        assert b"431" not in resp


def _read_all_or_first(s: socket.socket) -> bytes:
    data = b""
    while b"got 3 bytes" not in data:
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        data += chunk
    return data


def test_the_per_client_cap_refuses_the_extra_connection(server):
    port, proto = server
    held = [_connect(port) for _ in range(3)]
    try:
        for s in held:  # each connection is counted once it is accepted: make sure all three are
            s.sendall(_request())
            _response(s)
        with _connect(port) as extra:
            resp = _read_all(extra)
            assert resp.startswith(b"HTTP/1.1 503") and b"too_many_connections" in resp
        assert proto.state["refused"] >= 1
    finally:
        for s in held:
            s.close()


def test_choices_that_are_not_installed_or_unknown_are_config_errors(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_compiled(name, *args, **kwargs):
        if name in ("httptools", "uvloop"):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_compiled)
    assert http_implementation("auto") == "h11" and event_loop("auto") == "asyncio"  # the fallbacks
    with pytest.raises(ConfigError, match="server.http"):
        http_implementation("httptools")
    with pytest.raises(ConfigError, match="server.loop"):
        event_loop("uvloop")
    with pytest.raises(ConfigError, match="server.http"):
        http_implementation("fast")
