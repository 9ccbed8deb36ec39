"""Proxy mode (issue 40 item 1): the guard in front of a model server that already runs — KServe, Triton, TorchServe's
KServe v2 endpoint, or another ``guard serve`` — speaking the Open Inference Protocol v2 over REST.

The guard keeps everything it does in direct mode (keys, budgets, the defense, the watermark, the detector, the log,
one transaction per answer) and replaces only the model: :class:`UpstreamModel` is an ``nn.Module`` whose forward
asks the upstream for the batch's logits (``output = "logits"``) or probabilities (``output = "probs"``, returned as
their logarithm, so that the service's ``softmax`` gives them back). The upstream's weights never reach modelward.

The HTTP layer does not let the model call block: for each request it awaits :meth:`UpstreamModel.fetch` (an
asyncio HTTP/1.1 client with kept-alive connections, TLS and mutual TLS) *before* the service takes its lock, and
hands the answer to the forward through :func:`prefetched` (a context variable, which follows the request into a
worker thread). A forward without a prefetched answer (``svc.answer`` from Python) calls the upstream synchronously.

Failures are the upstream's, never charged: ``upstream_unavailable`` (cannot connect: 503), ``upstream_timeout``
(504), ``upstream_error`` (the upstream answered an error: 502; its body goes to the server log, not to the client)
and ``upstream_bad_output`` (wrong shape, non-finite values, probabilities that are not a distribution: 502).

Example:
    >>> # GUARD.toml: [upstream] url = "http://127.0.0.1:8081", model = "digits", output = "logits"
    >>> svc = build_service("guard.toml")  # doctest: +SKIP
    >>> svc.answer(svc.keys["my-key"], x)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import torch
from torch import nn

from modelward.errors import ConfigError
from modelward.extraction.guard.config import UpstreamSection
from modelward.extraction.guard.errors import GuardError

try:
    import orjson

    _loads, _dumps = orjson.loads, orjson.dumps
except ImportError:  # pragma: no cover - orjson is a dependency
    import json

    _loads = json.loads

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

log = logging.getLogger("modelward.guard")


def _dumps_array(payload: dict[str, Any]) -> bytes:
    """JSON with numpy arrays written by orjson directly (float32 values in their shortest exact form: ~10× faster
    than ``tolist`` + dumps; the upstream reads back the same float32)."""
    try:
        return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
    except NameError:  # pragma: no cover - without orjson
        t = payload["inputs"][0]
        return _dumps({**payload, "inputs": [{**t, "data": t["data"].tolist()}]})

#: the upstream's answer for the request being handled: (input batch, logits); set by the HTTP layer
_PREFETCHED: contextvars.ContextVar[tuple[torch.Tensor, torch.Tensor] | None] = contextvars.ContextVar(
    "modelward_guard_upstream_answer", default=None)
#: the request the HTTP layer already parsed: (its body, the parsed request), so that the service does not parse it
#: a second time (~0.1–0.5 ms for 16 rows on this CPU)
_PARSED: contextvars.ContextVar[tuple[bytes, Any] | None] = contextvars.ContextVar(
    "modelward_guard_parsed_request", default=None)
# probabilities must sum to 1 within float32 rounding of a K-term sum (K ≤ a few thousand: ≤ 1e-3 is generous)
PROB_SUM_TOL = 1e-3
_DTYPES = {"FP32": "<f4", "FP64": "<f8", "FP16": "<f2", "BF16": None}


@contextlib.contextmanager
def prefetched(x: torch.Tensor, logits: torch.Tensor, body: bytes | None = None, request: Any = None
               ) -> Iterator[None]:
    """While the block runs (and in worker threads it starts), :class:`UpstreamModel` answers ``x`` with
    ``logits`` instead of calling the upstream again, and :func:`parsed` gives ``request`` for this very ``body``."""
    token = _PREFETCHED.set((x, logits))
    ptoken = _PARSED.set((body, request)) if body is not None else None
    try:
        yield
    finally:
        _PREFETCHED.reset(token)
        if ptoken is not None:
            _PARSED.reset(ptoken)


def parsed(body: bytes) -> Any:
    """The request the HTTP layer parsed from this very ``body`` object (proxy mode), else None."""
    got = _PARSED.get()
    return got[1] if got is not None and got[0] is body else None


def _ssl_context(cfg: UpstreamSection, base_dir: Path) -> ssl.SSLContext | None:
    if not cfg.url.startswith("https://"):
        return None
    try:
        ctx = ssl.create_default_context(cafile=str(base_dir / cfg.ca) if cfg.ca else None)
        if cfg.cert and cfg.key:
            ctx.load_cert_chain(str(base_dir / cfg.cert), str(base_dir / cfg.key))
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"upstream: cannot load the TLS files (ca {cfg.ca}, cert {cfg.cert}, key {cfg.key}): {e}"
                          ) from None
    return ctx


class _Connection:
    """One kept-alive HTTP/1.1 connection to the upstream (asyncio streams)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        self.writer.close()

    async def exchange(self, request: bytes) -> tuple[int, dict[str, str], bytes, bool]:
        """Send one request, read its response: ``(status, headers, body, reusable)``."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise GuardError("upstream_error", f"the upstream sent a malformed status line: {lines[0][:80]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        reusable = headers.get("connection", "").lower() != "close" and parts[0] == "HTTP/1.1"
        if "content-length" in headers:
            body = await self.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                chunk = await self.reader.readexactly(size + 2)
                if size == 0:
                    break
                chunks.append(chunk[:-2])
            body = b"".join(chunks)
        else:  # delimited by the end of the connection
            body, reusable = await self.reader.read(), False
        return status, headers, body, reusable


class UpstreamClient:
    """The Open Inference Protocol v2 REST client of proxy mode: an asyncio pool of kept-alive connections for the
    request path, and a synchronous client (httpx) for start-up checks and Python calls.

    Args:
        cfg: the ``[upstream]`` section.
        base_dir: the config file's folder (TLS files are relative to it).
    """

    def __init__(self, cfg: UpstreamSection, base_dir: Path) -> None:
        self.cfg = cfg
        u = urlsplit(cfg.url)
        self.host, self.tls = u.hostname or "", u.scheme == "https"
        self.port = u.port or (443 if self.tls else 80)
        self.ssl = _ssl_context(cfg, base_dir)
        version = f"/versions/{cfg.version}" if cfg.version else ""
        self.model_path = f"/v2/models/{cfg.model}{version}"
        token = None
        if cfg.token_env:
            token = os.environ.get(cfg.token_env)
            if not token:
                raise ConfigError(f"upstream.token_env: the environment variable {cfg.token_env} (the upstream's "
                                  "bearer token) is not set")
        self._auth = f"Authorization: Bearer {token}\r\n" if token else ""
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._host_header = cfg.host_header or f"{self.host}:{self.port}"
        if cfg.host_header:
            self._headers["Host"] = cfg.host_header
        self._idle: list[_Connection] = []
        self._sem: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sync: Any = None

    # ----------------------------------------------------------------------------------------- asyncio (request path)
    async def _connect(self) -> _Connection:
        try:
            async with asyncio.timeout(self.cfg.connect_timeout_s):
                reader, writer = await asyncio.open_connection(
                    self.host, self.port, ssl=self.ssl, server_hostname=self.host if self.ssl else None,
                    limit=2 ** 24)
        except TimeoutError:
            raise GuardError("upstream_unavailable", f"the model server at {self.cfg.url} did not accept a "
                             f"connection within {self.cfg.connect_timeout_s:g} s; nothing was charged") from None
        except ssl.SSLError as e:
            raise GuardError("upstream_unavailable", f"TLS to the model server at {self.cfg.url} failed "
                             f"({e.reason or e}); nothing was charged") from None
        except OSError as e:
            raise GuardError("upstream_unavailable", f"the model server at {self.cfg.url} is unreachable "
                             f"({e.strerror or e}); nothing was charged") from None
        sock = writer.get_extra_info("socket")
        if sock is not None:
            import socket

            with contextlib.suppress(OSError):  # a request is one write: do not wait for the ACK of the last one
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _Connection(reader, writer)

    def _request_bytes(self, method: str, path: str, body: bytes = b"", extra: str = "") -> bytes:
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self._host_header}\r\n{self._auth}{extra}"
                f"Content-Length: {len(body)}\r\n\r\n")
        return head.encode("latin-1") + body

    async def request(self, method: str, path: str, body: bytes = b"", extra: str = "",
                      timeout: float | None = None) -> tuple[int, dict[str, str], bytes]:
        """One request over a kept-alive connection (a new one if none is idle); a reused connection the upstream
        had closed is retried once on a new one (only when nothing of the response arrived)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # first use, or a new event loop (tests): a pool per loop
            self._loop, self._sem, self._idle = loop, asyncio.Semaphore(self.cfg.max_connections), []
        assert self._sem is not None
        data = self._request_bytes(method, path, body, extra)
        try:
            async with asyncio.timeout(timeout or self.cfg.timeout_s), self._sem:
                for attempt in (0, 1):
                    reused = bool(self._idle)
                    conn = self._idle.pop() if reused else await self._connect()
                    try:
                        status, headers, payload, reusable = await conn.exchange(data)
                    except (asyncio.IncompleteReadError, ConnectionError) as e:
                        conn.close()
                        got = isinstance(e, asyncio.IncompleteReadError) and bool(e.partial)
                        if reused and not got and attempt == 0:
                            continue  # the upstream closed an idle connection: nothing was sent to the model
                        raise GuardError("upstream_error", f"the model server at {self.cfg.url} closed the "
                                         "connection before answering; nothing was charged") from None
                    except ssl.SSLError as e:  # TLS 1.3: a refused client certificate arrives after the handshake,
                        conn.close()  # as an alert on the first read
                        raise GuardError("upstream_unavailable", f"TLS to the model server at {self.cfg.url} failed "
                                         f"({e.reason or e}); nothing was charged") from None
                    except BaseException:
                        conn.close()
                        raise
                    if reusable:
                        self._idle.append(conn)
                    else:
                        conn.close()
                    return status, headers, payload
        except TimeoutError:
            raise GuardError("upstream_timeout", f"the model server at {self.cfg.url} did not answer within "
                             f"{timeout or self.cfg.timeout_s:g} s; nothing was charged") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def infer_request(self, x: torch.Tensor) -> tuple[bytes, str]:
        """The upstream's inference request body for the batch ``x`` and its extra headers."""
        c = self.cfg
        arr = np.ascontiguousarray(x.detach().cpu().numpy(), dtype=np.float32)
        tensor: dict[str, Any] = {"name": c.input_name, "shape": list(arr.shape), "datatype": "FP32"}
        payload: dict[str, Any] = {"inputs": [tensor]}
        if c.output_name:
            payload["outputs"] = [{"name": c.output_name}]
        if c.binary:
            blob = arr.astype("<f4", copy=False).tobytes()
            tensor["parameters"] = {"binary_data_size": len(blob)}
            head = _dumps(payload)
            return head + blob, (f"Content-Type: application/octet-stream\r\n"
                                 f"Inference-Header-Content-Length: {len(head)}\r\n")
        tensor["data"] = arr.reshape(-1)
        return _dumps_array(payload), "Content-Type: application/json\r\n"

    async def infer(self, x: torch.Tensor) -> np.ndarray:
        """The upstream's output for the batch ``x`` (``[rows, K]`` float32), checked (:func:`read_output`)."""
        body, extra = self.infer_request(x)
        status, headers, payload = await self.request("POST", f"{self.model_path}/infer", body, extra)
        return self.read_output(status, headers, payload, int(x.shape[0]))

    # ----------------------------------------------------------------------------------------- answers
    def read_output(self, status: int, headers: dict[str, str], payload: bytes, rows: int) -> np.ndarray:
        """The output tensor of an upstream answer as float32 ``[rows, K]``; GuardError when it is an error or not
        what was asked."""
        c = self.cfg
        if status != 200:
            log.warning("guard: the upstream %s answered %d: %s", self.cfg.url, status,
                        payload[:500].decode("utf-8", "replace"))
            raise GuardError("upstream_error", f"the model server answered HTTP {status} (details in the guard's "
                             "log); nothing was charged")
        hl = headers.get("inference-header-content-length")
        blob = b""
        if hl is not None and hl.isdigit():
            payload, blob = payload[:int(hl)], payload[int(hl):]
        try:
            doc = _loads(payload)
            outputs = doc["outputs"]
            out = next((o for o in outputs if o.get("name") == c.output_name), None) if c.output_name else outputs[0]
            if out is None:
                raise KeyError(f"no output named {c.output_name!r} (outputs: {[o.get('name') for o in outputs]})")
            dtype = _DTYPES.get(out.get("datatype", "FP32"))
            if dtype is None:
                raise ValueError(f"datatype {out.get('datatype')!r} (expected FP32, FP64 or FP16)")
            shape = [int(d) for d in out["shape"]]
            if "data" in out:
                arr = np.asarray(out["data"], dtype=np.float64).astype(np.float32)
            else:
                arr = np.frombuffer(blob, dtype=dtype).astype(np.float32)
            arr = arr.reshape(shape)
        except (ValueError, KeyError, IndexError, TypeError, StopIteration) as e:
            raise GuardError("upstream_bad_output", f"the model server's answer is not an Open Inference Protocol "
                             f"response with a numeric output ({e}); nothing was charged") from None
        if arr.ndim != 2 or arr.shape[0] != rows:
            raise GuardError("upstream_bad_output", f"the model server answered shape {list(arr.shape)} for "
                             f"{rows} rows; expected [{rows}, classes]; nothing was charged")
        if not np.isfinite(arr).all():
            raise GuardError("upstream_bad_output", "the model server answered NaN or infinite values; nothing "
                             "was charged")
        if c.output == "probs":
            sums = arr.astype(np.float64).sum(1)
            if (arr < 0).any() or (np.abs(sums - 1.0) > PROB_SUM_TOL).any():
                raise GuardError("upstream_bad_output", f"upstream.output = 'probs' but the answer's rows are not "
                                 f"distributions (sums {sums.min():.4g}..{sums.max():.4g}); if the model server "
                                 "answers logits, set output = 'logits'; nothing was charged")
        return arr

    def to_logits(self, arr: np.ndarray) -> torch.Tensor:
        """What the service's ``softmax`` turns into the upstream's probabilities: the logits themselves, or the
        logarithm of the (renormalised) probabilities (``log 0 = -inf``, which softmax maps back to 0)."""
        t = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))
        if self.cfg.output == "probs":
            with np.errstate(divide="ignore"):
                t = torch.log(t / t.sum(1, keepdim=True))
        return t

    # ----------------------------------------------------------------------------------------- synchronous
    def _client(self) -> Any:
        if self._sync is None:
            import httpx

            self._sync = httpx.Client(base_url=self.cfg.url, headers=self._headers,
                                      verify=self.ssl if self.ssl is not None else True,
                                      timeout=httpx.Timeout(self.cfg.timeout_s, connect=self.cfg.connect_timeout_s))
        return self._sync

    def infer_sync(self, x: torch.Tensor) -> np.ndarray:
        """:meth:`infer` without an event loop (Python calls, ``guard check``)."""
        import httpx

        body, extra = self.infer_request(x)
        headers = dict(line.split(": ", 1) for line in extra.strip().split("\r\n"))
        try:
            r = self._client().post(f"{self.model_path}/infer", content=body, headers=headers)
        except httpx.TimeoutException:
            raise GuardError("upstream_timeout", f"the model server at {self.cfg.url} did not answer within "
                             f"{self.cfg.timeout_s:g} s; nothing was charged") from None
        except httpx.HTTPError as e:
            raise GuardError("upstream_unavailable", f"the model server at {self.cfg.url} is unreachable ({e}); "
                             "nothing was charged") from None
        return self.read_output(r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.content,
                                int(x.shape[0]))

    def metadata(self) -> dict[str, Any]:
        """The upstream model's metadata (``GET /v2/models/{model}``); GuardError when unreachable."""
        import httpx

        try:
            r = self._client().get(self.model_path)
        except httpx.HTTPError as e:
            raise GuardError("upstream_unavailable", f"the model server at {self.cfg.url} is unreachable ({e})"
                             ) from None
        if r.status_code != 200:
            raise GuardError("upstream_error", f"GET {self.cfg.url}{self.model_path}: HTTP {r.status_code} "
                             f"{r.text[:200]}")
        return r.json()

    async def ready(self) -> bool:
        """Whether the upstream says the model is ready (``GET /v2/models/{model}/ready``), within 2 s."""
        try:
            status, _, _ = await self.request("GET", f"{self.model_path}/ready", timeout=2.0)
        except GuardError:
            return False
        return status == 200

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle = []
        if self._sync is not None:
            self._sync.close()
            self._sync = None


def check_metadata(meta: dict[str, Any], cfg: UpstreamSection, input_shape: tuple[int, ...],
                   num_classes: int) -> list[str]:
    """How the upstream model's metadata disagrees with ``[model]`` (input shape, classes); [] when it agrees or
    does not say. Dimensions of -1 (variable) agree with anything."""
    problems = []

    def fits(got: list[Any], want: list[int]) -> bool:
        return len(got) == len(want) and all(int(g) in (-1, w) for g, w in zip(got, want, strict=True))

    inputs = {i.get("name"): i for i in meta.get("inputs") or [] if isinstance(i, dict)}
    tin = inputs.get(cfg.input_name)
    if inputs and tin is None:
        problems.append(f"the upstream has no input {cfg.input_name!r} (inputs: {sorted(map(str, inputs))}); set "
                        "upstream.input_name")
    elif tin is not None and "shape" in tin and not fits(tin["shape"], [-1, *input_shape]):
        problems.append(f"input {cfg.input_name!r} has shape {tin['shape']}, [model] says [-1, "
                        f"{', '.join(map(str, input_shape))}]")
    outputs = [o for o in meta.get("outputs") or [] if isinstance(o, dict)]
    out = next((o for o in outputs if o.get("name") == cfg.output_name), None) if cfg.output_name else (
        outputs[0] if outputs else None)
    if cfg.output_name and outputs and out is None:
        problems.append(f"the upstream has no output {cfg.output_name!r} (outputs: "
                        f"{[o.get('name') for o in outputs]})")
    elif out is not None and "shape" in out and not fits(out["shape"], [-1, num_classes]):
        problems.append(f"output {out.get('name')!r} has shape {out['shape']}, [model] says [-1, {num_classes}]")
    return problems


class UpstreamModel(nn.Module):
    """The served model in proxy mode: ``forward(x)`` returns the upstream's logits for ``x`` (or the log of its
    probabilities), from the answer the HTTP layer prefetched, else by a synchronous request.

    Args:
        cfg: the ``[upstream]`` section.
        base_dir: the config file's folder.
        input_shape, num_classes: the ``[model]`` contract the upstream must fulfil (checked against its metadata
            by :meth:`check`).
    """

    def __init__(self, cfg: UpstreamSection, base_dir: Path, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        self.cfg, self.input_shape, self.num_classes = cfg, tuple(input_shape), num_classes
        self.client = UpstreamClient(cfg, base_dir)
        self.calls = 0  # synchronous upstream calls (the request path prefetches: this stays 0 when serving)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = _PREFETCHED.get()
        # the request's own batch (the service parses the body again: equal values, another tensor)
        if pre is not None and (pre[0] is x or (pre[0].shape == x.shape and torch.equal(pre[0], x))):
            return pre[1]
        self.calls += 1
        return self.client.to_logits(self.client.infer_sync(x))

    async def fetch(self, x: torch.Tensor) -> torch.Tensor:
        """The upstream's logits for ``x`` (for :func:`prefetched`), without blocking the event loop."""
        try:
            return self.client.to_logits(await self.client.infer(x))
        except GuardError as e:
            e.rows = int(x.shape[0])
            raise

    def check(self) -> list[str]:
        """The upstream's metadata against ``[model]``: the disagreements ([] if none); GuardError if unreachable."""
        return check_metadata(self.client.metadata(), self.cfg, self.input_shape, self.num_classes)

    def close(self) -> None:
        self.client.close()

    def extra_repr(self) -> str:
        return f"{self.cfg.url}{self.client.model_path} ({self.cfg.output})"


def wait_ready(model: UpstreamModel, timeout: float) -> list[str]:
    """Poll the upstream's metadata until it answers or ``timeout`` passes (a guard started beside its model
    server); returns :meth:`UpstreamModel.check`'s disagreements, or raises its GuardError at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return model.check()
        except GuardError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


__all__ = ["PROB_SUM_TOL", "UpstreamClient", "UpstreamModel", "check_metadata", "parsed", "prefetched",
           "wait_ready"]
