"""Connection hygiene for the guard's HTTP server: timeouts and connection caps at the transport, before a request
reaches the routes (issue 31: idle or half-sent connections never timed out, and 1,100 idle connections made the
server unreachable at a 1,024-descriptor limit).

:func:`limited_h11_protocol` returns a subclass of uvicorn's h11 protocol that

* closes a connection whose request head (request line and headers) is not complete ``header_timeout`` seconds after
  the connection opened or the previous response ended, or that sends nothing for ``idle_timeout`` seconds between
  requests (uvicorn's keep-alive timeout; uvicorn has no timeout before the first request);
* closes a connection whose request body has not fully arrived ``body_timeout`` seconds after its head (the route
  sees a client disconnect and logs it as such);
* answers ``503`` and closes at once when the client's address already holds ``max_per_client`` connections or the
  server holds ``max_total`` — the descriptor is given back immediately.

Every connection is checked by one timer per second (no per-byte cost).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("modelward.guard")


@dataclass(frozen=True)
class ConnectionLimits:
    """Timeouts (seconds) and connection caps; see the module docstring."""

    header_timeout: float = 10.0
    body_timeout: float = 30.0
    idle_timeout: float = 5.0
    max_per_client: int = 32
    max_total: int = 512
    check_every: float = 1.0


def _refusal(message: str) -> bytes:
    body = json.dumps({"error": message, "code": "too_many_connections"}).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"retry-after: 1\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def limited_h11_protocol(limits: ConnectionLimits) -> type[H11Protocol]:
    """A uvicorn ``http=`` protocol class enforcing ``limits`` (pass it as ``uvicorn.Config(http=...)``).

    Args:
        limits: the timeouts and caps.

    Returns:
        An ``H11Protocol`` subclass with its own per-client connection counter.

    Example:
        >>> cls = limited_h11_protocol(ConnectionLimits(header_timeout=5))
        >>> cls.limits.header_timeout
        5
    """
    per_client: Counter[str] = Counter()

    class LimitedH11Protocol(H11Protocol):
        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._host = self.client[0] if self.client else "?"
            per_client[self._host] += 1
            self._counted = True
            self._since = time.monotonic()  # start of the wait for a request head
            self._got_bytes = False  # bytes of the next request head arrived
            self._body_since: float | None = None
            why = None
            if per_client[self._host] > limits.max_per_client:
                why = f"{self._host} holds {limits.max_per_client} connections already (the limit per client)"
            elif len(self.connections) > limits.max_total:
                why = f"the server holds {limits.max_total} connections (its limit)"
            if why is not None:
                log.warning("guard: refused a connection: %s", why)
                transport.write(_refusal(f"too many connections: {why}; retry later"))
                transport.close()
                self._watch = None
                return
            self._watch = self.loop.call_later(limits.check_every, self._check)

        def connection_lost(self, exc: Exception | None) -> None:
            if getattr(self, "_counted", False):
                self._counted = False
                per_client[self._host] -= 1
                if per_client[self._host] <= 0:
                    del per_client[self._host]
            if getattr(self, "_watch", None) is not None:
                self._watch.cancel()
                self._watch = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            waiting = self.cycle is None or self.cycle.response_complete
            if waiting and not self._got_bytes:
                self._got_bytes = True
            super().data_received(data)
            if self.cycle is not None and not self.cycle.response_complete and self._body_since is None:
                self._body_since = time.monotonic()  # the head is complete: the body's clock starts

        def on_response_complete(self) -> None:
            self._since, self._got_bytes, self._body_since = time.monotonic(), False, None
            super().on_response_complete()

        def _check(self) -> None:
            self._watch = None
            if self.transport.is_closing():
                return
            now = time.monotonic()
            cycle = self.cycle
            why = None
            if cycle is None or cycle.response_complete:
                if self._got_bytes and now - self._since > limits.header_timeout:
                    why = f"request head not complete within {limits.header_timeout:g} s"
                elif not self._got_bytes and now - self._since > max(limits.idle_timeout, limits.header_timeout
                                                                      if cycle is None else 0.0):
                    why = "idle"
            elif cycle.more_body and self._body_since is not None and now - self._body_since > limits.body_timeout:
                why = f"request body not received within {limits.body_timeout:g} s"
            if why is not None:
                if why != "idle":
                    log.warning("guard: closed the connection from %s: %s", self._host, why)
                self.transport.close()
                return
            self._watch = self.loop.call_later(limits.check_every, self._check)

    LimitedH11Protocol.limits = limits  # type: ignore[attr-defined]
    LimitedH11Protocol.per_client = per_client  # type: ignore[attr-defined]
    return LimitedH11Protocol


__all__ = ["ConnectionLimits", "limited_h11_protocol"]
