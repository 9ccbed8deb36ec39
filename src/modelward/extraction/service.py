"""Guarded prediction service: a model behind a prediction-perturbation defense, served over the Open Inference
Protocol (KServe v2, JSON over HTTP) with API keys, per-key query budgets, size limits and a query log.

The defense runs server-side; only defended probabilities leave the process (never logits or clean
probabilities). Every request — answered or rejected — is logged to SQLite, and per-key usage lives in the same
database, so budgets survive restarts. A stateful defense (ModelGuard-S) is persisted to ``state_dir`` and
reloaded on start.

Endpoints (Open Inference Protocol REST): ``GET /v2`` (server metadata), ``GET /v2/health/live``,
``GET /v2/health/ready``, ``GET /v2/models/{name}[/versions/1]`` (metadata), ``GET /v2/models/{name}[/versions/1]/ready``,
``POST /v2/models/{name}[/versions/1]/infer`` (JSON or the binary tensor extension; ``id`` and ``parameters`` are
echoed), ``GET /openapi.json``. Errors are ``{"error": msg, "code": code}`` with a 4xx status — also for unknown
routes — and are logged; the server keeps serving. One server per ``state_dir`` (a lock file names the holder).
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from fastapi import Request
from pydantic import Field, field_validator
from torch import nn

from modelward.core.config import StrictModel, load_config
from modelward.core.device import DeviceSetting, resolve_device
from modelward.core.io import load_state_dict
from modelward.core.lock import FolderLock
from modelward.core.seed import seeded
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError, DataError, ModelwardError
from modelward.extraction.defenses import PredictionDefense, make_defense

try:  # 10× faster than the standard library on tensors of floats (the request's main cost); same semantics, except
    # that NaN/Infinity literals (not JSON) are invalid JSON rather than non-finite data: both are 400s
    import orjson

    _loads, _dumps = orjson.loads, orjson.dumps
except ImportError:  # pragma: no cover - orjson is a dependency; keep working without it
    _loads = json.loads

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

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
    device: DeviceSetting = "cpu"  # where the model answers (docs/devices.md); defenses work on the CPU

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
        with seeded(cfg.defense.surrogate_seed):
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
    """SQLite query log + per-key usage (budgets survive restarts).

    Budgets are charged with one conditional ``UPDATE`` (atomic in SQLite, also across processes): a request is
    answered only if ``used + rows <= budget`` held at the instant its rows were added, so concurrent requests can
    never over-spend a key. WAL with ``synchronous=NORMAL``: a commit does not wait for fsync (the database stays
    consistent after a crash; only the last transactions can be lost on power failure).
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=30.0)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS usage (key_name TEXT PRIMARY KEY, used INTEGER NOT NULL)")
        self.db.execute("CREATE TABLE IF NOT EXISTS queries (id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL, "
                        "key_name TEXT, rows INTEGER, status INTEGER, code TEXT, max_l1 REAL, ms REAL)")
        self._lock = threading.Lock()
        self._known: set[str] = set()  # keys whose usage row exists

    def used(self, key_name: str) -> int:
        with self._lock:
            row = self.db.execute("SELECT used FROM usage WHERE key_name=?", (key_name,)).fetchone()
        return int(row[0]) if row else 0

    def reserve(self, key_name: str, rows: int, budget: int | None) -> None:
        """Charge ``rows`` to the key atomically, or raise 429 (nothing charged) when the budget would be exceeded."""
        with self._lock:
            if key_name not in self._known:
                self.db.execute("INSERT OR IGNORE INTO usage(key_name, used) VALUES(?, 0)", (key_name,))
                self._known.add(key_name)
            if budget is None:
                self.db.execute("UPDATE usage SET used = used + ? WHERE key_name = ?", (rows, key_name))
                return
            cur = self.db.execute("UPDATE usage SET used = used + ? WHERE key_name = ? AND used + ? <= ?",
                                  (rows, key_name, rows, budget))
            if cur.rowcount == 1:
                return
            used = int(self.db.execute("SELECT used FROM usage WHERE key_name=?", (key_name,)).fetchone()[0])
        raise ServiceError(429, "query_budget_exceeded", f"query budget of key {key_name!r} exhausted: "
                           f"{used} of {budget} used, {rows} requested")

    def append_centroids(self, table: str, start: int, labels: np.ndarray, vectors: np.ndarray) -> None:
        """Persist centroids ``start, start + 1, ...`` (one transaction; float64 bytes)."""
        rows = [(start + i, int(c), np.ascontiguousarray(v, dtype="<f8").tobytes())
                for i, (c, v) in enumerate(zip(labels, vectors, strict=True))]
        with self._lock:
            self.db.execute(f"CREATE TABLE IF NOT EXISTS {table} (seq INTEGER PRIMARY KEY, label INTEGER, vec BLOB)")
            self.db.execute("BEGIN")
            self.db.executemany(f"INSERT OR REPLACE INTO {table}(seq, label, vec) VALUES(?,?,?)", rows)
            self.db.execute("COMMIT")

    def centroids_from(self, table: str, start: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Centroids with index >= ``start`` in order; they must be contiguous (else the state is inconsistent)."""
        with self._lock:
            self.db.execute(f"CREATE TABLE IF NOT EXISTS {table} (seq INTEGER PRIMARY KEY, label INTEGER, vec BLOB)")
            rows = self.db.execute(f"SELECT seq, label, vec FROM {table} WHERE seq >= ? ORDER BY seq",
                                   (start,)).fetchall()
        if rows and [r[0] for r in rows] != list(range(start, start + len(rows))):
            raise DataError(f"{table}: centroid rows are not contiguous after {start}; start a new state with --reset")
        labels = np.array([r[1] for r in rows], dtype=np.int64)
        vecs = np.stack([np.frombuffer(r[2], dtype="<f8") for r in rows]) if rows else np.zeros((0, k))
        return labels, vecs

    def clear_centroids(self, table: str) -> None:
        with self._lock:
            self.db.execute(f"DROP TABLE IF EXISTS {table}")

    def refund(self, key_name: str, rows: int) -> None:
        """Give back a reservation whose request failed before it was answered."""
        with self._lock:
            self.db.execute("UPDATE usage SET used = MAX(0, used - ?) WHERE key_name = ?", (rows, key_name))

    def charge(self, key_name: str, rows: int) -> None:
        self.reserve(key_name, rows, None)

    def log(self, key_name: str | None, rows: int, status: int, code: str, max_l1: float | None, ms: float) -> None:
        with self._lock:
            self.db.execute("INSERT INTO queries(ts, key_name, rows, status, code, max_l1, ms) "
                            "VALUES(?,?,?,?,?,?,?)", (time.time(), key_name, rows, status, code, max_l1, ms))

    def close(self) -> None:
        with self._lock:
            self.db.close()


@dataclass
class InferRequest:
    """A parsed Open Inference Protocol request: the input batch and what the answer must echo."""

    x: torch.Tensor
    id: str | None = None
    parameters: dict[str, Any] | None = None
    binary_output: bool = False


@dataclass
class InferAnswer:
    """An encoded response body (JSON, or JSON header + binary tensor for the binary extension)."""

    body: bytes
    header_length: int | None  # Inference-Header-Content-Length when the binary extension is used
    rows: int
    max_l1: float


def _has_bool(raw: list) -> bool:
    """True if a (possibly nested) JSON list holds a boolean anywhere (bool is an int subclass in Python)."""
    stack = [raw]
    while stack:
        cur = stack.pop()
        for v in cur:
            if v is True or v is False:
                return True
            if isinstance(v, list):
                stack.append(v)
    return False


def state_fingerprint(cfg: GuardConfig) -> dict[str, Any]:
    """What the persisted defense state depends on: the model's name and classes and the defense's settings."""
    return {"model": {"name": cfg.model.name, "num_classes": cfg.model.num_classes,
                      "input_shape": list(cfg.model.input_shape)},
            "defense": json.loads(json.dumps(cfg.defense.model_dump(mode="json"), sort_keys=True))}


def _diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new)):
            out += _diff(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    return [] if old == new else [f"{prefix.rstrip('.')}: {old!r} -> {new!r}"]


class GuardService:
    """Model + defense + keys + log; :meth:`handle` implements one Open Inference Protocol inference request.

    Opening a service takes the ``state_dir`` lock (one server per state folder) and checks the folder's
    ``service.json`` — the defense settings its state was built with. Different settings are refused unless
    ``reset=True``, which discards the defense state (centroids) and records the new settings; the query log and
    the keys' usage are kept.
    """

    def __init__(self, cfg: GuardConfig, base_dir: Path, reset: bool = False, check_only: bool = False) -> None:
        self.cfg = cfg
        self.name = cfg.model.name
        self.input_shape = tuple(cfg.model.input_shape)
        self.num_classes = cfg.model.num_classes
        self.model = build_model(cfg.model.net, self.input_shape, self.num_classes)
        _load_weights(self.model, base_dir / cfg.model.checkpoint, "model.checkpoint")
        self.device = resolve_device(cfg.model.device)  # an unusable device is refused before serving
        self.model.to(self.device)
        self.defense = build_service_defense(cfg, base_dir)
        self.state_dir = base_dir / cfg.server.state_dir
        self.state_path = self.state_dir / f"{self.name}.{self.defense.name}.state.safetensors"
        self.keys = {k.key: k for k in cfg.keys}
        self._lock = threading.Lock()  # model and defense state change together
        self._closed = check_only  # check_only: no lock, no state, no log (``guard check`` beside a running server)
        # ModelGuard-S: new centroids are appended to SQLite as they appear (a full snapshot costs ~60 ms at 10k
        # centroids); the safetensors snapshot is written on shutdown, and the rows after it are replayed on start
        self._incremental = hasattr(self.defense, "centroids_since")
        self._centroid_table = f"centroids_{self.name}_{self.defense.name}".replace("-", "_").replace(".", "_")
        self.changes = self.fingerprint_changes()
        if check_only:
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._folder_lock = FolderLock(self.state_dir, what="guard")
        self._folder_lock.__enter__()
        try:
            self.changes = self.fingerprint_changes()  # again: another server may have changed it meanwhile
            self._check_fingerprint(reset)
            if self.defense.stateful and self.state_path.is_file():
                from modelward.core.io import load_tensors

                self.defense.load_state_dict(load_tensors(self.state_path))
            self.log = QueryLog(self.state_dir / cfg.server.query_log)
            if self._incremental:
                if reset:
                    self.log.clear_centroids(self._centroid_table)
                self._replay_centroids()
        except BaseException:
            self._folder_lock.__exit__(None, None, None)
            raise

    def fingerprint_changes(self) -> list[str]:
        """How this config's state settings differ from those ``state_dir`` was built with ([] if none/new)."""
        path = self.state_dir / "service.json"
        if not path.is_file():
            return []
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            old = {}
        return _diff(old, state_fingerprint(self.cfg))

    def _check_fingerprint(self, reset: bool) -> None:
        path = self.state_dir / "service.json"
        new = state_fingerprint(self.cfg)
        if path.is_file():
            changes = self.changes
            if changes and not reset:
                raise ConfigError(
                    f"server.state_dir {self.state_dir}: its state was built with different settings "
                    f"({'; '.join(changes)}). Serving it with these would silently reuse the old state; restore "
                    "the old settings, use another server.state_dir, or start a new state with --reset "
                    "(discards the defense state, keeps the query log and budgets)")
        elif not reset and any(self.state_dir.glob("*.state.safetensors")):
            raise ConfigError(f"server.state_dir {self.state_dir}: holds a defense state without service.json "
                              "(written by an older version); start a new state with --reset")
        if reset:
            for f in self.state_dir.glob("*.state.safetensors"):
                f.unlink()
        _atomic_write(path, json.dumps(new, indent=2, sort_keys=True) + "\n")

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
    def parse_request(self, body: bytes, header_length: str | None = None) -> InferRequest:
        """Parse and validate one inference request (JSON, or the binary tensor extension's header + blobs).

        Every malformed request raises :class:`ServiceError` (4xx): invalid or too deeply nested JSON, a value
        that is not a JSON number (strings, booleans at any depth, null), wrong shapes, NaN/inf.
        """
        binary = b""
        if header_length is not None:
            if not header_length.isdigit() or int(header_length) > len(body):
                raise ServiceError(400, "bad_request", f"Inference-Header-Content-Length {header_length!r} must be "
                                   f"an integer <= the body size ({len(body)} bytes)")
            n = int(header_length)
            body, binary = body[:n], body[n:]
        try:
            payload = _loads(body)
        except RecursionError:
            raise ServiceError(400, "bad_request", "request JSON is nested too deeply") from None
        except (ValueError, UnicodeDecodeError) as e:
            if "depth" in str(e):  # orjson's nesting limit
                raise ServiceError(400, "bad_request", "request JSON is nested too deeply") from None
            raise ServiceError(400, "bad_request", "request body is not valid JSON") from None
        if not isinstance(payload, dict) or not isinstance(payload.get("inputs"), list) or len(payload["inputs"]) != 1:
            raise ServiceError(400, "bad_request", "body must be {\"inputs\": [one tensor]} (Open Inference Protocol)")
        rid = payload.get("id")
        if rid is not None and not isinstance(rid, str):
            raise ServiceError(400, "bad_request", f"id must be a string, got {type(rid).__name__}")
        params = payload.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise ServiceError(400, "bad_request", "parameters must be an object")
        binary_out = bool(params and params.get("binary_data_output") is True)
        outputs = payload.get("outputs")
        if outputs is not None:
            if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
                raise ServiceError(400, "bad_request", "outputs must be a list of objects {\"name\": ...}")
            for o in outputs:
                if o.get("name") != OUTPUT_NAME:
                    raise ServiceError(400, "bad_request", f"unknown output {o.get('name')!r}; this model has one "
                                       f"output, {OUTPUT_NAME!r}")
                op = o.get("parameters")
                if op is not None and not isinstance(op, dict):
                    raise ServiceError(400, "bad_request", "outputs[].parameters must be an object")
                if op and "binary_data" in op:
                    binary_out = op["binary_data"] is True
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
        need = math.prod(shape)
        tparams = t.get("parameters")
        if tparams is not None and not isinstance(tparams, dict):
            raise ServiceError(400, "bad_request", "inputs[0].parameters must be an object")
        if tparams and "binary_data_size" in tparams:
            size = tparams["binary_data_size"]
            if header_length is None:
                raise ServiceError(400, "bad_request", "inputs[0].parameters.binary_data_size needs the "
                                   "Inference-Header-Content-Length header (binary tensor extension)")
            if not isinstance(size, int) or isinstance(size, bool) or size != len(binary) or size != 4 * need:
                raise ServiceError(400, "bad_shape", f"binary_data_size {size!r}: shape {shape} in FP32 needs "
                                   f"{4 * need} bytes and {len(binary)} bytes follow the JSON header")
            if "data" in t:
                raise ServiceError(400, "bad_request", "inputs[0] has both data and binary_data_size")
            data = np.frombuffer(binary, dtype="<f4").astype(np.float32)
        else:
            if binary:
                raise ServiceError(400, "bad_request", "binary data follows the JSON header but no input declares "
                                   "parameters.binary_data_size")
            data = self._json_data(t.get("data"), body, shape, need)
        if not np.isfinite(data).all():
            raise ServiceError(400, "bad_data", "inputs[0].data contains NaN or infinite values")
        return InferRequest(torch.from_numpy(data.reshape(shape)), rid, params, binary_out)

    @staticmethod
    def _json_data(raw: Any, body: bytes, shape: list[int], need: int) -> np.ndarray:
        if not isinstance(raw, list):
            raise ServiceError(400, "bad_data", "inputs[0].data must be a list of numbers (flat, row-major, or "
                               "nested to the tensor's shape)")
        try:
            arr = np.asarray(raw)
        except (ValueError, TypeError, RecursionError, OverflowError):
            raise ServiceError(400, "bad_data", "inputs[0].data must be a flat list of numbers or a list nested "
                               "exactly to the tensor's shape") from None
        if arr.dtype.kind not in "fiu":
            what = {"U": "strings", "S": "strings", "b": "booleans"}.get(arr.dtype.kind, "non-numbers")
            raise ServiceError(400, "bad_data", f"inputs[0].data must hold JSON numbers only, found {what}")
        # bools mixed with numbers are silently converted by numpy; JSON true/false only exist if the text has them
        if (b"true" in body or b"false" in body) and _has_bool(raw):
            raise ServiceError(400, "bad_data", "inputs[0].data must hold JSON numbers only, found booleans")
        if arr.ndim != 1 and list(arr.shape) != shape:
            raise ServiceError(400, "bad_shape", f"inputs[0].data is nested as {list(arr.shape)}; use a flat list "
                               f"or nest it as {shape}")
        if arr.size != need:
            raise ServiceError(400, "bad_shape", f"inputs[0].data has {arr.size} values; shape {shape} "
                               f"needs {need}")
        with np.errstate(over="ignore"):
            return arr.astype(np.float32).reshape(-1)

    # --------------------------------------------------------- inference
    @torch.no_grad()
    def answer(self, key: KeySection, x: torch.Tensor) -> tuple[torch.Tensor, float]:
        """Charge the key's budget and return the defended probabilities and their max ℓ1 distortion."""
        n = int(x.shape[0])
        self.log.reserve(key.name, n, key.budget)  # atomic: 429 before any work if the budget is spent
        try:
            with self._lock:
                # the model runs on its device; the defense and the answer work on CPU probabilities
                probs = torch.softmax(self.model(x.to(self.device)).float(), dim=1).cpu()
                before = self.defense.num_centroids if hasattr(self.defense, "num_centroids") else None
                y_hat = self.defense.defend(probs, x) if self.defense.needs_inputs else self.defense.defend(probs)
                if self.defense.stateful and (before is None or self.defense.num_centroids != before):
                    if self._incremental:
                        self._append_centroids(before)
                    else:
                        self.save_state()
        except BaseException:
            self.log.refund(key.name, n)
            raise
        y32 = y_hat.float()
        return y32, float(np.abs(y_hat.numpy().astype(np.float64) - probs.numpy()).sum(1).max())

    def encode(self, req: InferRequest, y_hat: torch.Tensor) -> tuple[bytes, int | None]:
        """The response body: JSON, or JSON header + little-endian FP32 blob when binary output was asked for."""
        out: dict[str, Any] = {"name": OUTPUT_NAME, "datatype": "FP32", "shape": list(y_hat.shape)}
        blob = b""
        if req.binary_output:
            blob = y_hat.numpy().astype("<f4").tobytes()
            out["parameters"] = {"binary_data_size": len(blob)}
        else:
            out["data"] = y_hat.flatten().tolist()
        resp: dict[str, Any] = {"model_name": self.name, "model_version": "1"}
        if req.id is not None:
            resp["id"] = req.id
        if req.parameters:
            resp["parameters"] = req.parameters
        resp["outputs"] = [out]
        head = _dumps(resp)
        return (head + blob, len(head)) if req.binary_output else (head, None)

    def handle(self, key: KeySection, body: bytes, header_length: str | None) -> InferAnswer:
        """Parse, charge, defend and encode one request (runs in a worker thread, off the event loop)."""
        req = self.parse_request(body, header_length)
        y_hat, max_l1 = self.answer(key, req.x)
        payload, hl = self.encode(req, y_hat)
        return InferAnswer(payload, hl, int(req.x.shape[0]), max_l1)

    def _append_centroids(self, start: int) -> None:
        labels, vecs = self.defense.centroids_since(start)
        self.log.append_centroids(self._centroid_table, start, labels, vecs)

    def _replay_centroids(self) -> None:
        n = self.defense.num_centroids
        labels, vecs = self.log.centroids_from(self._centroid_table, n, self.num_classes)
        if len(labels):
            self.defense.extend_centroids(labels, vecs)

    def save_state(self) -> None:
        if self.defense.stateful:
            from modelward.core.io import save_tensors

            save_tensors(self.state_path, self.defense.state_dict(), {"defense": self.defense.name,
                                                                      "params": json.dumps(self.defense.params())})

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            with self._lock:
                self.save_state()
            self.log.close()
        finally:
            self._folder_lock.__exit__(None, None, None)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def build_service(config_path: str | Path, overrides: list[str] | None = None, reset: bool = False,
                  check_only: bool = False) -> GuardService:
    path = Path(config_path)
    cfg = load_guard_config(path, overrides)
    return GuardService(cfg, path.resolve().parent, reset=reset, check_only=check_only)


# ------------------------------------------------------------------------------------------------ HTTP app
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


INLINE_BYTES = int(os.environ.get("MODELWARD_GUARD_INLINE_BYTES", 64 * 1024))
# defenses whose answer for max_batch rows takes well under a millisecond (answered on the event loop when small)
FAST_DEFENSES = ("none", "modelguard_s", "top1", "rounding", "reverse_sigmoid", "gaussian_noise")


def create_app(service: GuardService):  # -> fastapi.FastAPI
    """The FastAPI app serving ``service`` (Open Inference Protocol REST, errors as ``{"error": ...}``)."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        service.close()

    app = FastAPI(title="modelward guard (Open Inference Protocol)", version=_package_version(), lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url="/openapi.json")

    def error(status: int, code: str, message: str) -> JSONResponse:
        return JSONResponse({"error": message, "code": code}, status_code=status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        msg = f"{request.method} {request.url.path}: {exc.detail}"
        if exc.status_code == 404:
            msg += " (endpoints: GET /v2, /v2/health/{live,ready}, /v2/models/{name}[/versions/1][/ready], " \
                   "POST /v2/models/{name}[/versions/1]/infer, GET /openapi.json)"
        service.log.log(None, 0, exc.status_code, code, None, 0.0)
        return error(exc.status_code, code, msg)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        service.log.log(None, 0, 400, "bad_request", None, 0.0)
        return error(400, "bad_request", f"{request.url.path}: {exc.errors()}")

    def check_model(name: str, version: str | None) -> None:
        if name != service.name:
            raise ServiceError(404, "unknown_model", f"model {name!r} not found; this server serves {service.name!r}")
        if version is not None and version != "1":
            raise ServiceError(404, "unknown_version", f"model {name!r} has version '1' only, not {version!r}")

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
    async def ready() -> dict[str, bool]:
        return {"ready": True}

    async def model_ready(name: str, version: str | None = None):
        try:
            check_model(name, version)
        except ServiceError as e:
            service.log.log(None, 0, e.status, e.code, None, 0.0)
            return error(e.status, e.code, e.message)
        return {"name": name, "ready": True}

    async def model_metadata(name: str, version: str | None = None):
        try:
            check_model(name, version)
        except ServiceError as e:
            service.log.log(None, 0, e.status, e.code, None, 0.0)
            return error(e.status, e.code, e.message)
        return service.metadata()

    async def infer(name: str, request: Request, version: str | None = None):
        t0 = time.perf_counter()
        key_name: str | None = None
        rows = 0
        try:
            check_model(name, version)
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
            hl = request.headers.get("inference-header-content-length")
            if len(body) <= INLINE_BYTES and service.defense.name in FAST_DEFENSES:
                # a small request takes well under a millisecond: a thread hop would cost more than it saves
                ans = _handle_logged(service, key, bytes(body), hl, t0)
            else:  # large bodies (JSON parsing ~0.1 s per MB) and slow defenses run off the event loop
                ans = await run_in_threadpool(_handle_logged, service, key, bytes(body), hl, t0)
            if ans.header_length is None:
                return Response(ans.body, media_type="application/json")
            return Response(ans.body, media_type="application/octet-stream",
                            headers={"Inference-Header-Content-Length": str(ans.header_length)})
        except ServiceError as e:
            await run_in_threadpool(service.log.log, key_name, rows, e.status, e.code, None,
                                    (time.perf_counter() - t0) * 1e3)
            return error(e.status, e.code, e.message)
        except (DataError, ConfigError) as e:
            await run_in_threadpool(service.log.log, key_name, rows, 400, "bad_request", None,
                                    (time.perf_counter() - t0) * 1e3)
            return error(400, "bad_request", str(e))
        except Exception as e:  # noqa: BLE001 - answered and logged; the server keeps serving
            service.log.log(key_name, rows, 500, "internal_error", None, (time.perf_counter() - t0) * 1e3)
            return error(500, "internal_error", f"internal error ({type(e).__name__}); see the server log")

    model_route("", model_metadata, methods=["GET"])
    model_route("/ready", model_ready, methods=["GET"])
    model_route("/infer", infer, methods=["POST"], openapi_extra={"requestBody": _INFER_BODY}, responses=_ERRORS)
    return app


def _handle_logged(service: GuardService, key: KeySection, body: bytes, header_length: str | None,
                   t0: float) -> InferAnswer:
    ans = service.handle(key, body, header_length)
    service.log.log(key.name, ans.rows, 200, "ok", ans.max_l1, (time.perf_counter() - t0) * 1e3)
    return ans


def serve(config_path: str | Path, host: str | None = None, port: int | None = None,
          overrides: list[str] | None = None, reset: bool = False) -> None:
    """Run the guarded service until interrupted (SIGINT/SIGTERM save the defense state)."""
    import uvicorn

    service = build_service(config_path, overrides, reset=reset)
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
        service.close()


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
