"""The network-shaping proxy: added round-trip time, bandwidth limit, emulated loss, order preserved."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from modelward.errors import ConfigError
from modelward.governance.transport.shaping import ShapingProxy


@pytest.fixture()
def echo_server():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                while data := conn.recv(65536):
                    conn.sendall(data)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield f"127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    t.join(2)
    srv.close()


def _rtt(address: str, n: int = 5) -> float:
    host, port = address.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        best = 1e9
        for _ in range(n):
            t0 = time.monotonic()
            s.sendall(b"x")
            assert s.recv(1) == b"x"
            best = min(best, time.monotonic() - t0)
    return best


def test_the_proxy_adds_the_round_trip_time(echo_server: str) -> None:
    with ShapingProxy(echo_server, delay_ms=75) as proxy:
        rtt = _rtt(proxy.address)
    assert 0.150 <= rtt < 0.30, rtt


def test_the_proxy_limits_bandwidth_and_keeps_order(echo_server: str) -> None:
    payload = bytes(range(256)) * 2048  # 512 KiB
    with ShapingProxy(echo_server, rate_mbit=20) as proxy:
        host, port = proxy.address.split(":")
        t0 = time.monotonic()
        with socket.create_connection((host, int(port)), timeout=30) as s:
            got = bytearray()

            def send() -> None:
                s.sendall(payload)

            th = threading.Thread(target=send)
            th.start()
            while len(got) < len(payload):
                got += s.recv(65536)
            th.join()
        seconds = time.monotonic() - t0
    assert bytes(got) == payload  # nothing reordered or lost
    # 512 KiB each way at 20 Mbit/s: at least ~0.2 s per direction; pipelined, so at least one direction's worth
    assert seconds >= 0.2, seconds


def test_emulated_loss_costs_retransmission_timeouts(echo_server: str) -> None:
    with ShapingProxy(echo_server, delay_ms=1, loss=0.5, seed=1) as proxy:
        host, port = proxy.address.split(":")
        with socket.create_connection((host, int(port)), timeout=30) as s:
            times = []
            for _ in range(10):
                t0 = time.monotonic()
                s.sendall(b"y")
                assert s.recv(1) == b"y"
                times.append(time.monotonic() - t0)
    assert sum(t > 0.19 for t in times) >= 3  # about half of the chunks (each way) paid 200 ms


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ConfigError):
        ShapingProxy("127.0.0.1:1", delay_ms=-1)
    with pytest.raises(ConfigError):
        ShapingProxy("nohostport")
