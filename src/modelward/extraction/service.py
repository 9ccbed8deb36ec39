"""Guarded prediction service: a model behind a prediction-perturbation defense, served over the Open Inference
Protocol (KServe v2, JSON over HTTP) with API keys, per-key query budgets, size limits and a query log.

The defense runs server-side; only defended probabilities leave the process (never logits or clean
probabilities). Every request — answered or rejected — is logged to SQLite, and per-key usage lives in the same
database, so budgets survive restarts. A stateful defense (ModelGuard-S) is persisted to ``state_dir`` and
reloaded on start.

Endpoints: ``GET /v2/health/live``, ``GET /v2/health/ready``, ``GET /v2/models/{name}`` (metadata),
``GET /v2/models/{name}/ready``, ``POST /v2/models/{name}/infer``. Errors are ``{"error": msg, "code": code}``
with a 4xx status; the server keeps serving.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from fastapi import Request
from pydantic import Field, field_validator
from torch import nn

from modelward.core.config import StrictModel, load_config
from modelward.core.io import load_state_dict
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError, DataError, ModelwardError
from modelward.extraction.defenses import PredictionDefense, make_defense
from modelward.extraction.defenses.base import l1_distortion

INPUT_NAME = "input"
OUTPUT_NAME = "probabilities"


class ServiceError(ModelwardError):
    """A request the service rejects; carries the HTTP status and a machine-readable code."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


# ------------------------------------------------------------------------------------------------ config
class ServerSection(StrictModel):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_batch: int = Field(256, ge=1)  # rows per request
    max_body_bytes: int = Field(8_000_000, ge=1024)
    state_dir: str = "guard_state"  # relative to the config file
    query_log: str = "queries.sqlite"  # relative to state_dir


class ModelSection(StrictModel):
    name: str = "model"
    checkpoint: str  # safetensors state dict, relative to the config file
    input_shape: list[int]
    num_classes: int = Field(ge=2)
    net: ModelConfig = Field(default_factory=ModelConfig)

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not v or not all(ch.isalnum() or ch in "-_." for ch in v):
            raise ValueError("model name must be non-empty and use only letters, digits, '-', '_' or '.'")
        return v

    @field_validator("input_shape")
    @classmethod
    def _shape_ok(cls, v: list[int]) -> list[int]:
        if not v or min(v) < 1:
            raise ValueError("input_shape must list positive sizes, e.g. [1, 8, 8]")
        return v


class DefenseSection(StrictModel):
    name: str = "modelguard_s"
    params: dict[str, Any] = Field(default_factory=dict)
    # model-dependent defenses: MAD's surrogate is a random-init copy of the architecture seeded by surrogate_seed;
    # AdaptiveMisinformation's misinformation model is loaded from misinformation_checkpoint (same architecture)
    surrogate_seed: int = 0
    misinformation_checkpoint: str | None = None


class KeySection(StrictModel):
    name: str
    key: str = Field(min_length=8)
    budget: int | None = Field(None, ge=0)  # queries (rows); None = unlimited


class GuardConfig(StrictModel):
    server: ServerSection = Field(default_factory=ServerSection)
    model: ModelSection
    defense: DefenseSection = Field(default_factory=DefenseSection)
    keys: list[KeySection] = Field(min_length=1)


def load_guard_config(path: str | Path, overrides: list[str] | None = None) -> GuardConfig:
    cfg = load_config(path, GuardConfig, overrides)
    names = [k.name for k in cfg.keys]
    if len(set(names)) != len(names) or len({k.key for k in cfg.keys}) != len(cfg.keys):
        raise ConfigError(f"{path}: keys: names and keys must be unique")
    return cfg


# ------------------------------------------------------------------------------------------------ service
def build_service_defense(cfg: GuardConfig, base_dir: Path) -> PredictionDefense:
    """The configured defense; builds the models MAD / AdaptiveMisinformation need."""
    params = dict(cfg.defense.params)
    shape, k = tuple(cfg.model.input_shape), cfg.model.num_classes
    if cfg.defense.name == "mad":
        torch.manual_seed(cfg.defense.surrogate_seed)
        params["surrogate"] = build_model(cfg.model.net, shape, k)
    elif cfg.defense.name == "adaptive_misinformation":
        if not cfg.defense.misinformation_checkpoint:
            raise ConfigError("defense.misinformation_checkpoint: required for adaptive_misinformation "
                              "(a safetensors checkpoint of the misinformation model, same architecture)")
        mis = build_model(cfg.model.net, shape, k)
        _load_weights(mis, base_dir / cfg.defense.misinformation_checkpoint, "defense.misinformation_checkpoint")
        params["misinformation"] = mis
    return make_defense(cfg.defense.name, **params)


def _load_weights(model: nn.Module, path: Path, field: str) -> None:
    state, _ = load_state_dict(path)
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise ConfigError(f"{field}: {path} does not match the configured architecture: {e}") from None
    model.eval()


class QueryLog:
    """SQLite query log + per-key usage (budgets survive restarts)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS usage (key_name TEXT PRIMARY KEY, used INTEGER NOT NULL)")
        self.db.execute("CREATE TABLE IF NOT EXISTS queries (id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL, "
                        "key_name TEXT, rows INTEGER, status INTEGER, code TEXT, max_l1 REAL, ms REAL)")
        self._lock = threading.Lock()

    def used(self, key_name: str) -> int:
        with self._lock:
            row = self.db.execute("SELECT used FROM usage WHERE key_name=?", (key_name,)).fetchone()
        return int(row[0]) if row else 0

    def charge(self, key_name: str, rows: int) -> None:
        with self._lock:
            self.db.execute("INSERT INTO usage(key_name, used) VALUES(?, ?) ON CONFLICT(key_name) "
                            "DO UPDATE SET used = used + excluded.used", (key_name, rows))

    def log(self, key_name: str | None, rows: int, status: int, code: str, max_l1: float | None, ms: float) -> None:
        with self._lock:
            self.db.execute("INSERT INTO queries(ts, key_name, rows, status, code, max_l1, ms) "
                            "VALUES(?,?,?,?,?,?,?)", (time.time(), key_name, rows, status, code, max_l1, ms))

    def close(self) -> None:
        with self._lock:
            self.db.close()


class GuardService:
    """Model + defense + keys + log; :meth:`infer` implements one KServe v2 inference request."""

    def __init__(self, cfg: GuardConfig, base_dir: Path) -> None:
        self.cfg = cfg
        self.name = cfg.model.name
        self.input_shape = tuple(cfg.model.input_shape)
        self.num_classes = cfg.model.num_classes
        self.model = build_model(cfg.model.net, self.input_shape, self.num_classes)
        _load_weights(self.model, base_dir / cfg.model.checkpoint, "model.checkpoint")
        self.defense = build_service_defense(cfg, base_dir)
        self.state_dir = base_dir / cfg.server.state_dir
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.state_path = self.state_dir / f"{self.name}.{self.defense.name}.state.safetensors"
        if self.defense.stateful and self.state_path.is_file():
            from modelward.core.io import load_tensors

            self.defense.load_state_dict(load_tensors(self.state_path))
        self.log = QueryLog(self.state_dir / cfg.server.query_log)
        self.keys = {k.key: k for k in cfg.keys}
        self._lock = threading.Lock()  # model, defense state and budgets change together

    # --------------------------------------------------------- metadata
    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "versions": ["1"], "platform": "modelward-guard",
                "inputs": [{"name": INPUT_NAME, "datatype": "FP32", "shape": [-1, *self.input_shape]}],
                "outputs": [{"name": OUTPUT_NAME, "datatype": "FP32", "shape": [-1, self.num_classes]}],
                "parameters": {"defense": self.defense.name, "max_batch_size": self.cfg.server.max_batch}}

    # --------------------------------------------------------- auth
    def authenticate(self, authorization: str | None, api_key: str | None) -> KeySection:
        token = api_key
        if authorization:
            scheme, _, value = authorization.partition(" ")
            if scheme.lower() != "bearer" or not value:
                raise ServiceError(401, "unauthenticated", "Authorization header must be 'Bearer <api key>'")
            token = value.strip()
        if not token:
            raise ServiceError(401, "unauthenticated", "missing API key (send 'Authorization: Bearer <key>')")
        key = self.keys.get(token)
        if key is None:
            raise ServiceError(401, "unauthenticated", "unknown API key")
        return key

    # --------------------------------------------------------- request parsing
    def parse_inputs(self, body: bytes) -> torch.Tensor:
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise ServiceError(400, "bad_request", "request body is not valid JSON") from None
        if not isinstance(payload, dict) or not isinstance(payload.get("inputs"), list) or len(payload["inputs"]) != 1:
            raise ServiceError(400, "bad_request", "body must be {\"inputs\": [one tensor]} (KServe v2)")
        t = payload["inputs"][0]
        if not isinstance(t, dict):
            raise ServiceError(400, "bad_request", "inputs[0] must be an object with name, shape, datatype, data")
        if t.get("name") != INPUT_NAME:
            raise ServiceError(400, "bad_request", f"inputs[0].name must be {INPUT_NAME!r}, got {t.get('name')!r}")
        if t.get("datatype") != "FP32":
            raise ServiceError(400, "bad_datatype", f"inputs[0].datatype must be 'FP32', got {t.get('datatype')!r}")
        shape = t.get("shape")
        if (not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
                or len(shape) != 1 + len(self.input_shape) or tuple(shape[1:]) != self.input_shape
                or shape[0] < 1):
            raise ServiceError(400, "bad_shape", f"inputs[0].shape must be [batch >= 1, "
                               f"{', '.join(map(str, self.input_shape))}], got {shape!r}")
        if shape[0] > self.cfg.server.max_batch:
            raise ServiceError(413, "batch_too_large",
                               f"batch of {shape[0]} rows exceeds max_batch={self.cfg.server.max_batch}")
        raw = t.get("data")
        if isinstance(raw, list) and any(isinstance(v, bool) for v in raw):  # numpy would read true as 1.0
            raise ServiceError(400, "bad_data", "inputs[0].data must be numbers, not booleans")
        try:
            data = np.asarray(raw, dtype=np.float32)
        except (ValueError, TypeError):
            raise ServiceError(400, "bad_data", "inputs[0].data must be a (flat) list of numbers") from None
        if data.size != math.prod(shape):
            raise ServiceError(400, "bad_shape", f"inputs[0].data has {data.size} values; shape {shape} "
                               f"needs {math.prod(shape)}")
        if not np.isfinite(data).all():
            raise ServiceError(400, "bad_data", "inputs[0].data contains NaN or infinite values")
        return torch.from_numpy(data.reshape(shape))

    # --------------------------------------------------------- inference
    @torch.no_grad()
    def answer(self, key: KeySection, x: torch.Tensor) -> tuple[torch.Tensor, float]:
        """Charge the key's budget and return the defended probabilities and their max ℓ1 distortion."""
        n = int(x.shape[0])
        with self._lock:
            if key.budget is not None:
                used = self.log.used(key.name)
                if used + n > key.budget:
                    raise ServiceError(429, "query_budget_exceeded", f"query budget of key {key.name!r} exhausted: "
                                       f"{used} of {key.budget} used, {n} requested")
            probs = torch.softmax(self.model(x).float(), dim=1)
            before = self.defense.num_centroids if hasattr(self.defense, "num_centroids") else None
            y_hat = self.defense.defend(probs, x) if self.defense.needs_inputs else self.defense.defend(probs)
            self.log.charge(key.name, n)
            if self.defense.stateful and (before is None or self.defense.num_centroids != before):
                self.save_state()
        return y_hat.float(), float(l1_distortion(probs, y_hat).max())

    def infer_response(self, y_hat: torch.Tensor) -> dict[str, Any]:
        return {"model_name": self.name, "model_version": "1",
                "outputs": [{"name": OUTPUT_NAME, "datatype": "FP32", "shape": list(y_hat.shape),
                             "data": y_hat.flatten().tolist()}]}

    def save_state(self) -> None:
        if self.defense.stateful:
            from modelward.core.io import save_tensors

            save_tensors(self.state_path, self.defense.state_dict(), {"defense": self.defense.name})

    def close(self) -> None:
        with self._lock:
            self.save_state()
        self.log.close()


def build_service(config_path: str | Path, overrides: list[str] | None = None) -> GuardService:
    path = Path(config_path)
    cfg = load_guard_config(path, overrides)
    return GuardService(cfg, path.resolve().parent)


# ------------------------------------------------------------------------------------------------ HTTP app
def create_app(service: GuardService):  # -> fastapi.FastAPI
    """The FastAPI app serving ``service``."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from starlette.concurrency import run_in_threadpool

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        service.close()

    app = FastAPI(title="modelward guard", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    def error(status: int, code: str, message: str) -> JSONResponse:
        return JSONResponse({"error": message, "code": code}, status_code=status)

    def check_model(name: str) -> JSONResponse | None:
        if name != service.name:
            return error(404, "unknown_model", f"model {name!r} not found; this server serves {service.name!r}")
        return None

    @app.get("/v2/health/live")
    async def live() -> dict[str, bool]:
        return {"live": True}

    @app.get("/v2/health/ready")
    async def ready() -> dict[str, bool]:
        return {"ready": True}

    @app.get("/v2/models/{name}/ready")
    async def model_ready(name: str):
        return check_model(name) or {"name": name, "ready": True}

    @app.get("/v2/models/{name}")
    async def model_metadata(name: str):
        return check_model(name) or service.metadata()

    @app.post("/v2/models/{name}/infer")
    async def infer(name: str, request: Request):
        t0 = time.perf_counter()
        key_name: str | None = None
        rows = 0
        try:
            if (resp := check_model(name)) is not None:
                return resp
            key = service.authenticate(request.headers.get("authorization"), request.headers.get("x-api-key"))
            key_name = key.name
            limit = service.cfg.server.max_body_bytes
            declared = request.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > limit:
                raise ServiceError(413, "body_too_large", f"request body of {declared} bytes exceeds {limit}")
            body = bytearray()
            async for chunk in request.stream():
                body.extend(chunk)
                if len(body) > limit:
                    raise ServiceError(413, "body_too_large", f"request body exceeds {limit} bytes")
            x = service.parse_inputs(bytes(body))
            rows = int(x.shape[0])
            y_hat, max_l1 = await run_in_threadpool(service.answer, key, x)
            service.log.log(key_name, rows, 200, "ok", max_l1, (time.perf_counter() - t0) * 1e3)
            return service.infer_response(y_hat)
        except ServiceError as e:
            service.log.log(key_name, rows, e.status, e.code, None, (time.perf_counter() - t0) * 1e3)
            return error(e.status, e.code, e.message)
        except (DataError, ConfigError) as e:
            service.log.log(key_name, rows, 400, "bad_request", None, (time.perf_counter() - t0) * 1e3)
            return error(400, "bad_request", str(e))

    return app


def serve(config_path: str | Path, host: str | None = None, port: int | None = None,
          overrides: list[str] | None = None) -> None:
    """Run the guarded service until interrupted (SIGINT/SIGTERM save the defense state)."""
    import uvicorn

    service = build_service(config_path, overrides)
    cfg = service.cfg.server
    host, port = host or cfg.host, cfg.port if port is None else port
    try:  # bind before uvicorn, so a busy port is a clear error (exit 2), not uvicorn's log line and exit 3
        sock = bind_socket(host, port)
    except ConfigError:
        service.close()
        raise
    try:
        name = service.name
        print(f"guard: serving model '{name}' behind {service.defense.name} at "
              f"http://{host}:{sock.getsockname()[1]}/v2/models/{name}/infer (state in {service.state_dir})",
              flush=True)
        print(f"READY {name} {host}:{sock.getsockname()[1]}", flush=True)
        server = uvicorn.Server(uvicorn.Config(create_app(service), log_level="warning", access_log=False))
        server.run(sockets=[sock])
    finally:
        sock.close()


def bind_socket(host: str, port: int):
    """A listening TCP socket on host:port (0 = any free port); ConfigError when the address is taken."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # same as uvicorn: TIME_WAIT does not block
        sock.bind((host, port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise ConfigError(f"server: cannot listen on {host}:{port} ({e.strerror}); another server is using "
                           "the port: stop it, or pick another with --port / server.port (0 = any free port)") from None
    sock.set_inheritable(True)
    return sock
