"""A userspace network-shaping TCP proxy for tests and benchmarks (the kernel here has no netem): one-way latency,
a bandwidth limit and optional loss between two parties, on 127.0.0.1.

Each direction of each connection is a pipeline: a reader takes chunks (≤ 64 KiB) as they arrive and stamps each
with its delivery time — arrival + one-way ``delay``, plus its serialisation time at ``rate`` behind the chunk
before it (a FIFO link: bytes never overtake each other) — and a writer delivers them at that time. The link is
transparent to TLS and HTTP/2. TCP itself never loses data, so ``loss`` is emulated as what a lost segment costs a
TCP connection: with probability ``loss`` a chunk is held back one retransmission timeout (``rto``, default
200 ms), and everything behind it waits (head-of-line blocking).

Example:
    >>> with ShapingProxy("127.0.0.1:50061", delay_ms=75) as proxy:  # doctest: +SKIP
    ...     client = GrpcPartyClient("bob", proxy.address, tls)      # 150 ms round trip to bob
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from dataclasses import dataclass

from modelward.errors import ConfigError

CHUNK = 64 * 1024


@dataclass(frozen=True)
class LinkShape:
    """One direction's shape: one-way delay (ms), rate (Mbit/s, None = unlimited), loss (probability per chunk)."""

    delay_ms: float = 0.0
    rate_mbit: float | None = None
    loss: float = 0.0
    rto_ms: float = 200.0

    def __post_init__(self) -> None:
        if self.delay_ms < 0 or (self.rate_mbit is not None and self.rate_mbit <= 0) or not 0 <= self.loss < 1:
            raise ConfigError(f"link shape: delay_ms >= 0, rate_mbit > 0 (or None) and 0 <= loss < 1 required, "
                              f"got {self}")


class ShapingProxy:
    """Forward ``127.0.0.1:<port>`` to ``target`` through a shaped link (both directions shaped alike).

    Args:
        target: ``host:port`` to forward to.
        delay_ms: one-way latency added in each direction (RTT += 2 × delay_ms).
        rate_mbit: bandwidth limit per direction and connection (None: unlimited).
        loss: probability that a chunk costs one retransmission timeout.
        seed: for the loss draws.
        listen: the local address to listen on (port 0: any free port).

    Returns:
        A proxy; ``start()`` / ``stop()`` or a ``with`` block; ``address`` is where to connect; ``bytes_forwarded``.
    """

    def __init__(self, target: str, delay_ms: float = 0.0, rate_mbit: float | None = None, loss: float = 0.0,
                 seed: int = 0, listen: str = "127.0.0.1:0") -> None:
        host, _, port = target.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"proxy target {target!r}: expected host:port")
        self.target = (host.strip("[]"), int(port))
        self.shape = LinkShape(delay_ms, rate_mbit, loss)
        lh, _, lp = listen.rpartition(":")
        self._listen = (lh or "127.0.0.1", int(lp or 0))
        self._rng = random.Random(seed)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._ready = threading.Event()
        self._tasks: set[asyncio.Task] = set()
        self.address = ""
        self.bytes_forwarded = 0
        self.connections = 0

    # -- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> ShapingProxy:
        self._thread = threading.Thread(target=self._run, name="shaping-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("shaping proxy did not start within 10 s")
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        self._server = loop.run_until_complete(asyncio.start_server(self._serve, *self._listen))
        sock = self._server.sockets[0].getsockname()
        self.address = f"{sock[0]}:{sock[1]}"
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    def stop(self) -> None:
        loop = self._loop
        if loop is None or not loop.is_running():
            return

        async def shutdown() -> None:
            assert self._server is not None
            self._server.close()
            tasks = [t for t in self._tasks if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), loop)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> ShapingProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the link --------------------------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        me = asyncio.current_task()
        assert me is not None
        self._tasks.add(me)  # stop() cancels and awaits every connection
        tasks: list[asyncio.Future] = []
        up_w: asyncio.StreamWriter | None = None
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
            tasks = [asyncio.ensure_future(self._pipe(reader, up_w)), asyncio.ensure_future(self._pipe(up_r, writer))]
            # the connection lives until both directions ended (a half-close is forwarded as EOF)
            await asyncio.gather(*tasks)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for w in (writer, up_w):
                if w is not None:
                    w.close()
            self._tasks.discard(me)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        shape = self.shape

        async def read() -> None:
            last = 0.0
            while True:
                data = await reader.read(CHUNK)
                now = time.monotonic()
                if not data:
                    await queue.put((max(now, last), b""))
                    return
                at = now + shape.delay_ms / 1e3
                if shape.rate_mbit is not None:  # serialised behind the previous chunk
                    at = max(at, last) + len(data) * 8 / (shape.rate_mbit * 1e6)
                if shape.loss and self._rng.random() < shape.loss:
                    at += shape.rto_ms / 1e3
                last = max(at, last)
                await queue.put((last, data))

        async def write() -> None:
            while True:
                at, data = await queue.get()
                wait = at - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                self.bytes_forwarded += len(data)
                await writer.drain()

        r, w = asyncio.ensure_future(read()), asyncio.ensure_future(write())
        try:
            await asyncio.gather(r, w)
        finally:
            r.cancel()
            w.cancel()
