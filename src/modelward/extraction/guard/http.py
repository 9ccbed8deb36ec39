"""The guarded service over HTTP: Open Inference Protocol REST routes (FastAPI on uvicorn), and nothing else.

Endpoints: ``GET /v2`` (server metadata), ``GET /v2/health/live``, ``GET /v2/health/ready``,
``GET /v2/models/{name}[/versions/1]`` (metadata), ``GET /v2/models/{name}[/versions/1]/ready``,
``POST /v2/models/{name}[/versions/1]/infer`` (JSON or the binary tensor extension; ``id`` and ``parameters`` are
echoed), ``GET /openapi.json``. Errors are ``{"error": msg, "code": code}`` with a 4xx status — also for unknown
routes — and are logged; the server keeps serving. Status codes are chosen here only: the codec, the query log and
the service raise :class:`~modelward.extraction.guard.errors.GuardError` with a machine-readable code
(KServe's ``protocol/rest/v2_endpoints.py`` around its data plane).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any

from fastapi import Request
from starlette.requests import ClientDisconnect
from starlette.routing import Route

from modelward.errors import ConfigError, DataError
from modelward.extraction.guard.connections import mark_authenticated
from modelward.extraction.guard.errors import GuardError, WouldBlock
from modelward.extraction.guard.keys import refuse_placeholder_keys
from modelward.extraction.guard.metrics import CONTENT_TYPE, GuardMetrics
from modelward.extraction.guard.proxy import UpstreamModel, prefetched, wait_ready
from modelward.extraction.guard.service import GuardService, build_service

log = logging.getLogger("modelward.guard")

#: HTTP status of each GuardError code (anything else a client sent wrong is a 400)
STATUS = {"unauthenticated": 401, "unknown_model": 404, "unknown_version": 404, "body_too_large": 413,
          "batch_too_large": 413, "query_budget_exceeded": 429, "store_busy": 503, "extraction_suspected": 403,
          "backdoor_trigger_suspected": 403,  # issue 41: STRIP under action = "refuse"
          "forbidden": 403, "shutting_down": 503,
          # proxy mode: the model server failed (nothing is charged)
          "upstream_unavailable": 503, "upstream_timeout": 504, "upstream_error": 502, "upstream_bad_output": 502}
INLINE_BYTES = int(os.environ.get("MODELWARD_GUARD_INLINE_BYTES", 64 * 1024))
ANSWERING = "being answered in a worker thread"


def _package_version() -> str:
    try:
        from importlib.metadata import version

        return version("modelward")
    except Exception:  # noqa: BLE001 - not installed as a distribution (PYTHONPATH checkout)
        return "0"


_INFER_BODY = {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "required": ["inputs"],
    "properties": {"id": {"type": "string"}, "parameters": {"type": "object"},
                   "inputs": {"type": "array", "minItems": 1, "maxItems": 1, "items": {
                       "type": "object", "required": ["name", "shape", "datatype"],
                       "properties": {"name": {"type": "string"}, "shape": {"type": "array",
                                                                              "items": {"type": "integer"}},
                                      "datatype": {"type": "string", "enum": ["FP32"]},
                                      "parameters": {"type": "object"},
                                      "data": {"type": "array", "items": {}}}}},
                   "outputs": {"type": "array", "items": {"type": "object"}}}}},
    "application/octet-stream": {"schema": {"type": "string", "format": "binary",
                                            "description": "binary tensor extension: JSON header of "
                                                           "Inference-Header-Content-Length bytes, then blobs"}}}}
_ERRORS = {str(s): {"description": d, "content": {"application/json": {"schema": {
    "type": "object", "properties": {"error": {"type": "string"}, "code": {"type": "string"}}}}}}
    for s, d in ((400, "malformed request"), (401, "missing or unknown API key"), (404, "unknown model or version"),
                 (413, "body or batch too large"), (429, "query budget exhausted"))}


def create_app(service: GuardService):  # -> fastapi.FastAPI
    """The FastAPI app serving ``service`` (Open Inference Protocol REST, errors as ``{"error": ...}``).

    Args:
        service: an open :class:`GuardService` (closed when the app shuts down).

    Returns:
        The ASGI app.

    Example:
        >>> uvicorn.run(create_app(build_service("guard.toml")))  # doctest: +SKIP
    """
    from contextlib import asynccontextmanager

    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException as StarletteHTTPException

    upstream = service.model if isinstance(service.model, UpstreamModel) else None  # proxy mode
    metrics = GuardMetrics(service)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        service.close()
        if upstream is not None:
            upstream.close()

    app = FastAPI(title="modelward guard (Open Inference Protocol)", version=_package_version(), lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.metrics = metrics

    def error(status: int, code: str, message: str, request_id: str | None = None) -> JSONResponse:
        # the body keeps its two fields (clients parse them); the request id travels in a header
        headers = None if request_id is None else {"X-Request-Id": request_id}
        resp = JSONResponse({"error": message, "code": code}, status_code=status, headers=headers)
        resp.guard_code = code  # type: ignore[attr-defined] - for the metrics
        return resp

    async def record(key_name: str | None, rows: int, status: int, code: str, t0: float | None = None,
                     request_id: str | None = None) -> None:
        """Log a request that changed nothing else: on the event loop when the store is free at once (one INSERT,
        cheaper than a thread hop: a client retrying a spent key costs the others little, issue 37), else off the
        loop (a locked query log never stalls it)."""
        ms = 0.0 if t0 is None else (time.perf_counter() - t0) * 1e3
        try:
            try:
                service.log.log(key_name, rows, status, code, None, ms, request_id, wait=False)
                return
            except WouldBlock:
                pass
            await run_in_threadpool(service.log.log, key_name, rows, status, code, None, ms, request_id)
        except Exception:  # noqa: BLE001 - the answer still goes out; the operator sees why the row is missing
            log.exception("guard: could not write the query-log row of request %s (%s %s)", request_id, status, code)

    async def refused(e: GuardError, key_name: str | None = None, t0: float | None = None,
                      request_id: str | None = None) -> JSONResponse:
        status = STATUS.get(e.code, 400)
        await record(key_name, e.rows, status, e.code, t0, request_id)
        return error(status, e.code, e.message, request_id)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        msg = f"{request.method} {request.url.path}: {exc.detail}"
        if exc.status_code == 404:
            msg += " (endpoints: GET /v2, /v2/health/{live,ready}, /v2/models/{name}[/versions/1][/ready], " \
                   "POST /v2/models/{name}[/versions/1]/infer, GET /openapi.json)"
        await record(None, 0, exc.status_code, code)
        return error(exc.status_code, code, msg)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        await record(None, 0, 400, "bad_request")
        return error(400, "bad_request", f"{request.url.path}: {exc.errors()}")

    def model_route(suffix: str, fn, **kw):  # noqa: ANN001, ANN202 - route both with and without a version
        app.add_api_route(f"/v2/models/{{name}}{suffix}", fn, **kw)
        app.add_api_route(f"/v2/models/{{name}}/versions/{{version}}{suffix}", fn, **kw)

    @app.get("/v2")
    async def server_metadata() -> dict[str, Any]:
        return {"name": "modelward-guard", "version": _package_version(), "extensions": ["binary_tensor_data"]}

    @app.get("/v2/health/live")
    async def live() -> dict[str, bool]:
        return {"live": True}

    @app.get("/v2/health/ready")
    async def ready():
        if upstream is not None and not await upstream.client.ready():  # proxy mode: ready when the upstream is
            return JSONResponse({"ready": False}, status_code=503)
        return {"ready": True}

    async def model_ready(name: str, version: str | None = None):
        try:
            service.check_model(name, version)
        except GuardError as e:
            return await refused(e)
        return {"name": name, "ready": True}

    async def model_metadata(name: str, version: str | None = None):
        try:
            service.check_model(name, version)
        except GuardError as e:
            return await refused(e)
        return service.metadata()

    async def infer(name: str, request: Request, version: str | None = None):
        t0 = time.perf_counter()
        resp = await answer(name, request, version, t0)
        ok = resp.status_code == 200
        metrics.observe(resp.status_code, "ok" if ok else getattr(resp, "guard_code", "error"),
                        time.perf_counter() - t0, getattr(resp, "guard_rows", 0))
        return resp

    async def answer(name: str, request: Request, version: str | None, t0: float):
        rid = uuid.uuid4().hex[:16]
        key_name: str | None = None
        stage = {"at": "waiting for its body"}  # where a cancellation (a shutdown past its timeout) finds it
        try:
            service.check_model(name, version)
            key = service.authenticate(request.headers.get("authorization"), request.headers.get("x-api-key"))
            key_name = key.name
            mark_authenticated(request.scope)  # this connection now keeps its place under connection pressure
            body = await read_capped(request, service.cfg.server.max_body_bytes)
            hl = request.headers.get("inference-header-content-length")
            ans = None
            if upstream is not None:  # proxy mode: ask the model server first, without blocking the loop
                ans = await proxied(key, body, hl, rid, t0, stage)
            elif len(body) <= INLINE_BYTES and service.defense.fast:
                # a small request takes well under a millisecond: a thread hop would cost more than it saves.
                # wait=False: if the model or the query log is busy (another request, an external lock) it raises
                # WouldBlock before any change, and the request goes to a worker thread: the loop never waits
                try:
                    ans = service.handle(key, body, hl, rid, t0, wait=False)
                except WouldBlock:
                    pass
            if ans is None:  # large bodies (JSON parsing ~0.1 s per MB), slow defenses, a busy store
                stage["at"] = ANSWERING
                ans = await run_in_threadpool(service.handle, key, body, hl, rid, t0)
        except asyncio.CancelledError:
            # uvicorn cancels the requests still running when a shutdown exceeds shutdown_timeout_s; re-raised, the
            # cancellation would be logged as "Exception in ASGI application" with a traceback (issue 37)
            return await cancelled(key_name, rid, t0, stage["at"])
        except GuardError as e:
            return await refused(e, key_name, t0, rid)
        except ClientDisconnect:
            log.info("guard: request %s: the client disconnected before sending its whole body", rid)
            await record(key_name, 0, 499, "client_disconnected", t0, rid)
            return error(499, "client_disconnected", "the client disconnected", rid)
        except (DataError, ConfigError) as e:
            await record(key_name, getattr(e, "rows", 0), 400, "bad_request", t0, rid)
            return error(400, "bad_request", str(e), rid)
        except Exception as e:  # noqa: BLE001 - answered and logged; nothing was charged; the server keeps serving
            log.exception("guard: request %s (key %s) failed; nothing was charged", rid, key_name)
            await record(key_name, getattr(e, "rows", 0), 500, "internal_error", t0, rid)
            return error(500, "internal_error", f"internal error ({type(e).__name__}); nothing was charged; see the "
                         f"server log for request {rid}", rid)
        headers = {"X-Request-Id": rid}
        if ans.header_length is None:
            resp = Response(ans.body, media_type="application/json", headers=headers)
        else:
            headers["Inference-Header-Content-Length"] = str(ans.header_length)
            resp = Response(ans.body, media_type="application/octet-stream", headers=headers)
        resp.guard_rows = ans.rows  # type: ignore[attr-defined] - for the metrics
        return resp

    async def proxied(key: Any, body: bytes, hl: str | None, rid: str, t0: float, stage: dict[str, str]) -> Any:
        """Proxy mode: parse, await the upstream's answer for the batch (no lock held, nothing charged yet), then
        answer as in direct mode with that answer prefetched (inline when small and fast, else in a thread)."""
        assert upstream is not None
        small = len(body) <= INLINE_BYTES
        stage["at"] = "parsing its body"
        req = service.parse_request(body, hl) if small else await run_in_threadpool(service.parse_request, body, hl)
        stage["at"] = "waiting for the model server"
        t_up = time.perf_counter()
        try:
            logits = await upstream.fetch(req.x)
        finally:
            metrics.upstream.observe(time.perf_counter() - t_up)
        with prefetched(req.x, logits, body, req):
            if small and service.defense.fast:
                try:
                    return service.handle(key, body, hl, rid, t0, wait=False)
                except WouldBlock:
                    pass
            stage["at"] = ANSWERING
            return await run_in_threadpool(service.handle, key, body, hl, rid, t0)

    async def cancelled(key_name: str | None, rid: str, t0: float, stage: str) -> JSONResponse:
        """A request cancelled at shutdown: one log line (no traceback), a log row when nothing else will write
        one, and a 503 if the connection still takes it."""
        took = time.perf_counter() - t0
        if stage == ANSWERING:  # the worker thread cannot be stopped: it commits (or not) as usual, and logs it
            log.warning("guard: request %s (key %s) cancelled by the shutdown after %.1f s while it was being "
                        "answered in a worker thread: that thread completes it (charged and logged if it commits), "
                        "but the client will not receive the answer", rid, key_name, took)
        else:
            log.warning("guard: request %s (key %s) cancelled by the shutdown after %.1f s while %s; nothing was "
                        "charged", rid, key_name, took, stage)
            try:  # on the loop, on purpose: the server stops right after, a worker thread might never run
                service.log.log(key_name, 0, 499, "cancelled", None, took * 1e3, rid)
            except Exception as e:  # noqa: BLE001 - the store may already be closed
                log.warning("guard: request %s: no log row for the cancellation (%s)", rid, e)
        return error(503, "shutting_down", "the server is shutting down; nothing was charged unless answered; retry "
                     "on another replica", rid)

    @app.get("/v2/guard/status")
    async def guard_status(request: Request):
        """The detector's verdict on every key and the watermark's count (operator keys only)."""
        try:
            key = service.authenticate(request.headers.get("authorization"), request.headers.get("x-api-key"))
            if not key.operator:
                raise GuardError("forbidden", f"key {key.name!r} is not an operator key (operator = true)")
            mark_authenticated(request.scope)
        except GuardError as e:
            return await refused(e)
        return await run_in_threadpool(service.status)

    @app.get("/metrics")
    async def prometheus(request: Request):
        """Prometheus metrics (operator keys only, unless server.metrics_public)."""
        if not service.cfg.server.metrics_public:
            try:
                key = service.authenticate(request.headers.get("authorization"), request.headers.get("x-api-key"))
                if not key.operator:
                    raise GuardError("forbidden", f"key {key.name!r} is not an operator key (operator = true); "
                                     "or set server.metrics_public = true where only the cluster reaches the port")
                mark_authenticated(request.scope)
            except GuardError as e:
                return await refused(e)
        body = await run_in_threadpool(metrics.render)  # reads the store: off the loop
        return Response(body, media_type=CONTENT_TYPE)

    model_route("", model_metadata, methods=["GET"])
    model_route("/ready", model_ready, methods=["GET"])
    model_route("/infer", infer, methods=["POST"], openapi_extra={"requestBody": _INFER_BODY}, responses=_ERRORS)

    # the request path without FastAPI's per-request parameter machinery (its dependency solving took ~0.3 ms of a
    # ~1 ms request, measured in process): plain Starlette routes, matched before the documented FastAPI ones
    # (which still give /openapi.json its infer operation and answer what these do not match, e.g. a 405)
    async def infer_route(request: Request):
        return await infer(request.path_params["name"], request, request.path_params.get("version"))

    for path in ("/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer"):
        app.router.routes.insert(0, Route(path, infer_route, methods=["POST"]))
    return app


async def read_capped(request: Request, limit: int) -> bytes:
    """The request body, refused (GuardError ``body_too_large``) as soon as it is declared or read beyond ``limit``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise GuardError("body_too_large", f"request body of {declared} bytes exceeds {limit}")
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > limit:
            raise GuardError("body_too_large", f"request body exceeds {limit} bytes")
    return bytes(body)


def serve(config_path: str | Path, host: str | None = None, port: int | None = None,
          overrides: list[str] | None = None, reset: bool = False) -> None:
    """Run the guarded service until interrupted (SIGINT/SIGTERM save the defense state).

    Args:
        config_path: the GUARD.toml.
        host, port: override ``server.host`` / ``server.port`` (0 = any free port).
        overrides: ``--set`` strings.
        reset: start a new defense state when the settings differ.

    Example:
        >>> serve("examples/guard_modelguard_s.toml", port=8080)  # doctest: +SKIP
    """
    import uvicorn

    # lazy: like uvicorn above, only serve() needs the server's connection limits (building the app does not)
    from modelward.extraction.guard.connections import ConnectionLimits, event_loop, limited_protocol

    _log_to_stderr()
    service = build_service(config_path, overrides, reset=reset)
    cfg = service.cfg.server
    host, port = host or cfg.host, cfg.port if port is None else port
    try:  # bind before uvicorn, so a busy port is a clear error (exit 2), not uvicorn's log line and exit 3
        limits = ConnectionLimits(header_timeout=cfg.header_timeout_s, body_timeout=cfg.body_timeout_s,
                                  idle_timeout=cfg.idle_timeout_s, max_per_client=cfg.max_connections_per_client,
                                  max_total=cfg.max_connections, reserve=cfg.reserve)
        protocol, loop = limited_protocol(limits, cfg.http), event_loop(cfg.loop)  # ConfigError: not installed
        sock = bind_socket(host, port)
        refuse_placeholder_keys(service.cfg, config_path)
        if isinstance(service.model, UpstreamModel):  # proxy mode: the model server must serve what [model] says
            _check_upstream(service.model, config_path)
    except ConfigError:
        if "sock" in locals():
            sock.close()
        service.close()
        raise
    service.start_key_refresh()
    try:
        name = service.name
        print(f"guard: serving model '{name}' behind {service.defense.name} at "
              f"http://{host}:{sock.getsockname()[1]}/v2/models/{name}/infer (state in {service.state_dir}; HTTP "
              f"{protocol.implementation}, loop {loop})", flush=True)
        print(f"READY {name} {host}:{sock.getsockname()[1]}", flush=True)
        app = create_app(service)
        conns: Any = protocol
        app.state.metrics.connections = lambda: {"open": sum(conns.per_client.values()), **conns.state}
        server = uvicorn.Server(uvicorn.Config(
            app, log_level="warning", access_log=False, http=protocol, loop=loop,
            timeout_keep_alive=cfg.idle_timeout_s,
            timeout_graceful_shutdown=cfg.shutdown_timeout_s))
        server.run(sockets=[sock])
    finally:
        sock.close()
        service.close()


def _check_upstream(upstream: UpstreamModel, config_path: str | Path) -> None:
    """At start: the upstream's metadata must agree with [model] (else exit 2, naming the differences); an upstream
    that does not answer within its timeout is a warning (readiness says 503 until it answers)."""
    try:
        problems = wait_ready(upstream, upstream.cfg.timeout_s)
    except GuardError as e:
        log.warning("guard: proxy mode: %s; serving anyway (GET /v2/health/ready answers 503 until it answers)",
                    e.message)
        return
    if problems:
        raise ConfigError(f"{config_path}: [upstream] {upstream.cfg.url}{upstream.client.model_path} does not "
                          f"serve what [model] says: {'; '.join(problems)}")


def _log_to_stderr() -> None:
    """The guard's own log lines (5xx with tracebacks, refused connections, repairs) on stderr, time-stamped."""
    logger = logging.getLogger("modelward.guard")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def bind_socket(host: str, port: int):
    """A listening TCP socket on host:port (0 = any free port); ConfigError when the address is taken.

    TCP_NODELAY: without it, Nagle's algorithm holds back a response's last segment until the client's delayed ACK
    (~40 ms on Linux) on every reused connection. The socket is created with ``IPPROTO_TCP`` so asyncio sets
    TCP_NODELAY on each accepted connection itself (it checks ``sock.proto``), and the option is also set on the
    listening socket (Linux copies it to accepted sockets).
    """
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # same as uvicorn: TIME_WAIT does not block
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise ConfigError(f"server: cannot listen on {host}:{port} ({e.strerror}); another server is using "
                           "the port: stop it, or pick another with --port / server.port (0 = any free port)") from None
    sock.set_inheritable(True)
    return sock
