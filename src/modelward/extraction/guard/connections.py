"""Connection hygiene for the guard's HTTP server: timeouts and connection caps at the transport, before a request
reaches the routes (issue 31: idle or half-sent connections never timed out, and 1,100 idle connections made the
server unreachable at a 1,024-descriptor limit).

:func:`limited_protocol` returns a subclass of uvicorn's HTTP/1.1 protocol — the compiled httptools parser when
``httptools`` is installed (uvicorn's own default; about a fifth of the guard's CPU per request went to the pure-Python
h11 parser and writer), else h11 — that

* closes a connection whose request head (request line and headers) is not complete ``header_timeout`` seconds after
  the connection opened or the previous response ended, or that sends nothing for ``idle_timeout`` seconds between
  requests (uvicorn's keep-alive timeout; uvicorn has no timeout before the first request);
* closes a connection whose request body has not fully arrived ``body_timeout`` seconds after its head (the route
  sees a client disconnect and logs it as such);
* answers ``503`` and closes at once when the client's address already holds ``max_per_client`` connections — the
  descriptor is given back immediately;
* keeps ``reserve`` connections for API keys (issue 37 item 5: from 20 addresses × 30 idle connections, a
  well-behaved client on another address got 503 for 67 % of its requests, the cap being global and first come
  first served). A connection counts as *authenticated* once a request on it presented a valid key
  (:func:`mark_authenticated`, called by the routes). When a new connection would make the unauthenticated ones
  more than ``max_total - reserve``, or all of them more than ``max_total``, the server **evicts** a connection that
  is not in the middle of a request (idle, or still sending its request head) instead of refusing the newcomer:
  unauthenticated ones first, from the address holding the most connections first, the oldest first;
  authenticated ones only at ``max_total`` and when no unauthenticated one is left to evict. Only when nothing can
  be evicted is the newcomer refused with ``503``. So idle and slow connections, from any number of addresses,
  can only push each other out; a key holder's kept-alive connections stay, and its new ones get in.

* answers ``431`` and closes a connection whose request head is not complete after ``max_head_bytes`` bytes
  (httptools, llhttp, would keep every header in memory however many arrive); with httptools also a head that
  completed within one read but parsed to more than ``max_head_bytes`` (h11 accepts a head that arrives whole in
  one read, at most one read of 256 KiB).

Every connection is checked by one timer per second (no per-byte cost); eviction looks at the open connections
only when the server is at its limits (O(open connections), at most ``max_total``). Both protocols share this code:
they keep the same per-connection state (``cycle``, ``cycle.response_complete``, ``cycle.more_body``,
``on_response_complete``), which is all the limits read.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from modelward.errors import ConfigError

log = logging.getLogger("modelward.guard")


@dataclass(frozen=True)
class ConnectionLimits:
    """Timeouts (seconds) and connection caps; see the module docstring."""

    header_timeout: float = 10.0
    body_timeout: float = 30.0
    idle_timeout: float = 5.0
    max_per_client: int = 32
    max_total: int = 512
    reserve: int = 64  # connections only authenticated ones may hold (the rest of max_total is for everyone)
    check_every: float = 1.0
    max_head_bytes: int = 16 * 1024  # a request line + headers at most (h11's own default limit)


#: open connections of every limited server in this process, by (server address, client address): how a route
#: reaches its connection (the ASGI scope carries both addresses, not the transport)
_LIVE: dict[tuple[Any, Any], Any] = {}


def mark_authenticated(scope: dict[str, Any]) -> None:
    """Record that the connection of this ASGI request presented a valid API key: from now on it is evicted only
    after every unauthenticated one (see the module docstring). A no-op outside :func:`limited_protocol`."""
    proto = _LIVE.get((_addr(scope.get("server")), _addr(scope.get("client"))))
    if proto is not None and not proto._authenticated:
        proto._authenticated = True
        proto.state["authenticated"] += 1


def _addr(a: Any) -> Any:
    return tuple(a) if isinstance(a, list | tuple) else a


def _refusal(message: str, status: bytes = b"503 Service Unavailable", code: str = "too_many_connections") -> bytes:
    body = json.dumps({"error": message, "code": code}).encode()
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"retry-after: 1\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class _HeadTooLarge(Exception):
    """Raised from httptools' parser callbacks when a request head passes ``max_head_bytes``."""


def http_implementation(choice: str = "auto") -> str:
    """The HTTP/1.1 protocol ``choice`` ("auto", "httptools" or "h11") resolves to here: "auto" is httptools when it
    is installed, else h11; "httptools" without the package is a ConfigError."""
    if choice not in ("auto", "httptools", "h11"):
        raise ConfigError(f"server.http: {choice!r} is not one of 'auto', 'httptools', 'h11'")
    if choice == "h11":
        return "h11"
    try:
        import httptools  # noqa: F401 - only whether it is installed
    except ImportError:
        if choice == "httptools":
            raise ConfigError("server.http = 'httptools' but the httptools package is not installed "
                              "(pip install httptools; or server.http = 'auto' to fall back to h11)") from None
        return "h11"
    return "httptools"


def event_loop(choice: str = "auto") -> str:
    """uvicorn's ``loop=`` setting for ``choice`` ("auto", "uvloop" or "asyncio"): "auto" is uvloop when it is
    installed, else asyncio's own loop; "uvloop" without the package is a ConfigError."""
    if choice not in ("auto", "uvloop", "asyncio"):
        raise ConfigError(f"server.loop: {choice!r} is not one of 'auto', 'uvloop', 'asyncio'")
    if choice == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401 - only whether it is installed
    except ImportError:
        if choice == "uvloop":
            raise ConfigError("server.loop = 'uvloop' but the uvloop package is not installed (pip install uvloop; "
                              "or server.loop = 'auto' to fall back to asyncio's loop)") from None
        return "asyncio"
    return "uvloop"


def limited_h11_protocol(limits: ConnectionLimits) -> type:
    """:func:`limited_protocol` on uvicorn's h11 protocol (the pure-Python fallback)."""
    return limited_protocol(limits, "h11")


def limited_protocol(limits: ConnectionLimits, http: str = "auto") -> type:
    """A uvicorn ``http=`` protocol class enforcing ``limits`` (pass it as ``uvicorn.Config(http=...)``).

    Args:
        limits: the timeouts and caps.
        http: "auto" (httptools when installed, else h11), "httptools" or "h11".

    Returns:
        A subclass of uvicorn's ``HttpToolsProtocol`` or ``H11Protocol`` with its own per-client connection counter
        (``.implementation`` says which).

    Example:
        >>> cls = limited_protocol(ConnectionLimits(header_timeout=5), "h11")
        >>> cls.limits.header_timeout, cls.implementation
        (5, 'h11')
    """
    # uvicorn only here: the routes import this module for mark_authenticated without loading the server
    impl = http_implementation(http)
    if impl == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Base
    else:
        from uvicorn.protocols.http.h11_impl import H11Protocol as Base

    capped = impl == "httptools"  # the parsed head's size is only seen through httptools' callbacks
    per_client: Counter[str] = Counter()
    # authenticated: connections marked by mark_authenticated; refused / evicted: totals (for /metrics)
    state = {"authenticated": 0, "refused": 0, "evicted": 0, "evicted_logged": 0}
    last_log = [0.0]

    class LimitedProtocol(Base):  # type: ignore[valid-type,misc]
        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._host = self.client[0] if self.client else "?"
            per_client[self._host] += 1
            self._counted = True
            self._authenticated = False
            self._opened = self._since = time.monotonic()  # start of the wait for a request head
            self._got_bytes = False  # bytes of the next request head arrived
            self._body_since: float | None = None
            self._head_bytes = 0  # bytes received while the request head is incomplete (httptools' cap)
            self._watch = None
            self._key = (_addr(self.server), _addr(self.client))
            _LIVE[self._key] = self
            why = None
            total = len(self.connections)
            if per_client[self._host] > limits.max_per_client:
                why = f"{self._host} holds {limits.max_per_client} connections already (the limit per client)"
            elif total > limits.max_total or total - state["authenticated"] > limits.max_total - limits.reserve:
                victim = self._victim(with_authenticated=total > limits.max_total)
                if victim is None:
                    why = (f"the server holds {total - 1} connections, every one of them busy with a request "
                           f"(limit {limits.max_total}, {limits.reserve} kept for API keys)")
                else:
                    victim._evict()
            if why is not None:
                state["refused"] += 1
                log.warning("guard: refused a connection: %s", why)
                transport.write(_refusal(f"too many connections: {why}; retry later"))
                transport.close()
                return
            self._watch = self.loop.call_later(limits.check_every, self._check)

        def _busy(self) -> bool:
            """In the middle of a request (its head arrived, its answer is not complete): never evicted."""
            return self.cycle is not None and not self.cycle.response_complete

        def _victim(self, with_authenticated: bool) -> LimitedProtocol | None:
            """The connection to evict: not busy; unauthenticated first, then (``with_authenticated``) the
            authenticated; within each, from the address holding the most connections, the oldest first."""
            best, best_key = None, None
            for c in self.connections:
                if c is self or not isinstance(c, LimitedProtocol) or c.transport.is_closing() or c._busy():
                    continue
                if c._authenticated and not with_authenticated:
                    continue
                key = (c._authenticated, -per_client[c._host], c._since)
                if best_key is None or key < best_key:
                    best, best_key = c, key
            return best

        def _evict(self) -> None:
            state["evicted"] += 1
            now = time.monotonic()
            if now - last_log[0] >= 10.0:  # under a flood: one line per 10 s, not one per connection
                n = state["evicted"] - state["evicted_logged"]
                state["evicted_logged"], last_log[0] = state["evicted"], now
                log.warning("guard: at the connection limit: evicted %d idle or unauthenticated connection(s) "
                            "(latest from %s, which held %d; %d open, %d authenticated)", n, self._host,
                            per_client[self._host], len(self.connections), state["authenticated"])
            self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            if getattr(self, "_counted", False):
                self._counted = False
                per_client[self._host] -= 1
                if per_client[self._host] <= 0:
                    del per_client[self._host]
                if self._authenticated:
                    state["authenticated"] -= 1
                    self._authenticated = False
                if _LIVE.get(self._key) is self:
                    del _LIVE[self._key]
            if getattr(self, "_watch", None) is not None:
                self._watch.cancel()
                self._watch = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            before = self.cycle
            waiting = before is None or before.response_complete
            if waiting:
                self._got_bytes = True
                if before is None or not before.more_body:  # not the rest of a body answered before it arrived
                    self._head_bytes += len(data)
            super().data_received(data)
            if self.cycle is not None and not self.cycle.response_complete and self._body_since is None:
                self._body_since = time.monotonic()  # the head is complete: the body's clock starts
            if waiting and self.cycle is before and self._head_bytes > limits.max_head_bytes:
                self._head_too_large()  # still no complete head after max_head_bytes

        def _head_too_large(self) -> None:
            if self.transport.is_closing():
                return
            log.warning("guard: closed the connection from %s: request head over %d bytes", self._host,
                        limits.max_head_bytes)
            self.transport.write(_refusal(f"request head over {limits.max_head_bytes} bytes",
                                          b"431 Request Header Fields Too Large", "head_too_large"))
            self.transport.close()

        if capped:  # httptools: the parsed head's own size too (a head completed within one large read)
            def on_message_begin(self) -> None:
                self._parsed_head = 0
                super().on_message_begin()

            def on_url(self, url: bytes) -> None:
                self._count_head(len(url))
                super().on_url(url)

            def on_header(self, name: bytes, value: bytes) -> None:
                self._count_head(len(name) + len(value) + 4)
                super().on_header(name, value)

            def _count_head(self, n: int) -> None:
                self._parsed_head = getattr(self, "_parsed_head", 0) + n
                if self._parsed_head > limits.max_head_bytes:
                    self._refuse_head = True
                    raise _HeadTooLarge  # the parser stops; uvicorn answers its parse error via send_400_response

            def send_400_response(self, msg: str) -> None:
                if getattr(self, "_refuse_head", False):
                    self._head_too_large()
                    return
                super().send_400_response(msg)

        def on_response_complete(self) -> None:
            self._since, self._got_bytes, self._body_since, self._head_bytes = time.monotonic(), False, None, 0
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

    LimitedProtocol.implementation = impl  # type: ignore[attr-defined]
    LimitedProtocol.limits = limits  # type: ignore[attr-defined]
    LimitedProtocol.per_client = per_client  # type: ignore[attr-defined]
    LimitedProtocol.state = state  # type: ignore[attr-defined]
    return LimitedProtocol


__all__ = ["ConnectionLimits", "event_loop", "http_implementation", "limited_h11_protocol", "limited_protocol", "mark_authenticated"]
