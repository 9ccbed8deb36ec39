"""The guard's configuration (GUARD.toml): server, model, defense and API keys; what its state depends on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from modelward.backdoor.detect.input.strip import StripSection
from modelward.core.config import StrictModel, load_config
from modelward.core.device import DeviceSetting
from modelward.core.zoo import ModelConfig
from modelward.errors import ConfigError
from modelward.extraction.guard.ownership import OwnershipSection


class ServerSection(StrictModel):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_batch: int = Field(256, ge=1)  # rows per request
    max_body_bytes: int = Field(8_000_000, ge=1024)
    state_dir: str = "guard_state"  # relative to the config file
    query_log: str = "queries.sqlite"  # relative to state_dir
    header_timeout_s: float = Field(10.0, gt=0)  # a request head must be complete within this (else: closed)
    body_timeout_s: float = Field(30.0, gt=0)  # a request body must arrive within this after its head
    idle_timeout_s: float = Field(5.0, gt=0)  # a kept-alive connection with no new request is closed after this
    max_connections: int = Field(512, ge=1)  # open connections in total (more: 503 and closed at once)
    max_connections_per_client: int = Field(32, ge=1)  # open connections per client address
    metrics_public: bool = False  # GET /metrics without an operator key (only where the port is cluster-internal)
    # connections only API-key holders may hold; idle or unauthenticated ones are evicted to keep them free
    # (None: max_connections // 8, e.g. 64 of 512)
    reserved_connections: int | None = Field(None, ge=0)
    shutdown_timeout_s: float = Field(10.0, gt=0)  # SIGTERM: requests still running after this are cancelled
    busy_timeout_s: float = Field(5.0, gt=0)  # how long a query-log write waits for another process's lock
    # retention (guard-state): days of *serving time* (clock jumps and downtime do not count); None = keep forever
    log_retention_days: float | None = Field(90.0, gt=0)  # query-log rows and idle keys' detector states
    log_max_rows: int | None = Field(None, ge=1000)  # keep at most this many query-log rows; None = no cap
    store_url: str | None = None  # postgresql://… : replicas share one store; None = SQLite query_log in state_dir
    # the HTTP/1.1 parser and the event loop (guard-perf3): "auto" takes the compiled httptools and uvloop when they
    # are installed (dependencies of modelward), else uvicorn's pure-Python h11 and asyncio's own loop
    http: Literal["auto", "httptools", "h11"] = "auto"
    loop: Literal["auto", "uvloop", "asyncio"] = "auto"

    @property
    def reserve(self) -> int:
        """The connections kept for API-key holders (``reserved_connections``, default ``max_connections // 8``)."""
        return self.max_connections // 8 if self.reserved_connections is None else self.reserved_connections

    @model_validator(mode="after")
    def _reserve_fits(self) -> ServerSection:
        if self.reserved_connections is not None and self.reserved_connections >= self.max_connections:
            raise ValueError(f"reserved_connections ({self.reserved_connections}) must be below max_connections "
                             f"({self.max_connections}): the rest is what unauthenticated clients may hold")
        return self


class ModelSection(StrictModel):
    name: str = "model"
    # safetensors state dict, relative to the config file; None with [upstream] (proxy mode: no weights here)
    checkpoint: str | None = None
    input_shape: list[int]
    num_classes: int = Field(ge=2)
    net: ModelConfig = Field(default_factory=ModelConfig)
    device: DeviceSetting = "cpu"  # where the model answers (docs/devices.md); defenses work on the CPU
    # text models (issue 39): INT64 token ids [batch, ≤ input_shape[0]] or BYTES strings [batch] (tokenized by
    # `tokenizer`, a local folder or tokenizer.json relative to the config file); FP32 for everything else
    input_datatype: Literal["FP32", "INT64", "BYTES"] = "FP32"
    tokenizer: str | None = None
    pad_id: int | None = Field(None, ge=0)  # default: the model's own padding id (0 if it has none)

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

    @model_validator(mode="after")
    def _text_ok(self) -> ModelSection:
        if self.input_datatype != "FP32" and len(self.input_shape) != 1:
            raise ValueError(f"input_datatype {self.input_datatype!r} is for text models: input_shape = [tokens]")
        if self.input_datatype == "BYTES" and not self.tokenizer:
            raise ValueError("input_datatype 'BYTES' needs model.tokenizer (a local tokenizer folder or "
                             "tokenizer.json)")
        return self


class DefenseSection(StrictModel):
    name: str = "modelguard_s"
    params: dict[str, Any] = Field(default_factory=dict)
    # model-dependent defenses: MAD's surrogate is a random-init copy of the architecture seeded by surrogate_seed;
    # AdaptiveMisinformation's misinformation model is loaded from misinformation_checkpoint (same architecture)
    surrogate_seed: int = 0
    misinformation_checkpoint: str | None = None


class UpstreamSection(StrictModel):
    """Proxy mode: the model server the guard stands in front of (Open Inference Protocol v2 over REST).

    The guard authenticates, charges, sends the batch to ``{url}/v2/models/{model}[/versions/{version}]/infer``,
    applies the defense to the upstream's ``output`` (logits or probabilities), watermarks, logs and answers; the
    upstream's weights never reach modelward. ``token_env`` names an environment variable holding a bearer token for
    the upstream (a secret never written in the config); ``ca`` / ``cert`` + ``key`` are PEM files (relative to the
    config) for TLS to an ``https://`` upstream and, optionally, a client certificate (mutual TLS).
    """

    url: str  # http://host:port or https://host:port of the model server
    model: str  # the model's name on the upstream
    version: str | None = None
    output: Literal["logits", "probs"] = "logits"  # what the upstream's output holds
    input_name: str = "input"  # the upstream's input tensor name
    output_name: str | None = None  # the upstream's output to read (None: its first output)
    binary: bool = False  # send the input with the binary tensor extension (Triton, KServe >= 0.11), else JSON
    timeout_s: float = Field(10.0, gt=0)  # one upstream request, connection included (then 504, nothing charged)
    connect_timeout_s: float = Field(2.0, gt=0)
    max_connections: int = Field(64, ge=1)  # kept-alive connections to the upstream
    token_env: str | None = None  # environment variable with a bearer token for the upstream
    host_header: str | None = None  # Host sent to the upstream (an ingress routing by host, e.g. KServe serverless)
    ca: str | None = None  # PEM bundle to verify an https:// upstream (default: the system's)
    cert: str | None = None  # client certificate (PEM) for mutual TLS, with key
    key: str | None = None

    @field_validator("url")
    @classmethod
    def _url_ok(cls, v: str) -> str:
        from urllib.parse import urlsplit

        u = urlsplit(v)
        if u.scheme not in ("http", "https") or not u.hostname or u.path not in ("", "/") or u.query:
            raise ValueError("expected http://host:port or https://host:port (the server's root, no path)")
        return v.rstrip("/")

    @model_validator(mode="after")
    def _pair(self) -> UpstreamSection:
        if (self.cert is None) != (self.key is None):
            raise ValueError("cert and key go together (the client certificate for mutual TLS and its key)")
        if self.url.startswith("http://") and (self.ca or self.cert):
            raise ValueError("ca / cert / key are for an https:// upstream; this url is http://")
        return self


class KeySection(StrictModel):
    name: str
    key: str = Field(min_length=8)
    budget: int | None = Field(None, ge=0)  # queries (rows); None = unlimited
    operator: bool = False  # may read GET /v2/guard/status (the detector's verdicts on every key)


class GuardConfig(StrictModel):
    server: ServerSection = Field(default_factory=ServerSection)
    model: ModelSection
    defense: DefenseSection = Field(default_factory=DefenseSection)
    keys: list[KeySection] = Field(min_length=1)
    ownership: OwnershipSection = Field(default_factory=OwnershipSection)
    strip: StripSection = Field(default_factory=StripSection)  # issue 41: STRIP backdoor-trigger monitor
    upstream: UpstreamSection | None = None  # proxy mode: answer from this model server instead of local weights

    @model_validator(mode="after")
    def _one_model(self) -> GuardConfig:
        if self.upstream is None and self.model.checkpoint is None:
            raise ValueError("model.checkpoint: required (the safetensors weights to serve), or give an [upstream] "
                             "model server to stand in front of (proxy mode)")
        if self.upstream is not None and self.model.checkpoint is not None:
            raise ValueError("model.checkpoint and [upstream] exclude each other: in proxy mode the upstream "
                             "answers and no weights are loaded here; remove one of them")
        if self.upstream is not None and self.strip.enabled:
            raise ValueError("strip.enabled: STRIP queries the model on blended copies of every row, which needs the "
                             "weights here; it is not available in proxy mode ([upstream]) — run it on the upstream's "
                             "side or serve the weights directly")
        return self


def load_guard_config(path: str | Path, overrides: list[str] | None = None) -> GuardConfig:
    """Read and validate a GUARD.toml (``overrides``: ``--set section.field=value``).

    Args:
        path: the TOML file.
        overrides: ``dotted.key=value`` strings applied before validation.

    Returns:
        The validated :class:`GuardConfig`.

    Raises:
        ConfigError: a bad field (named, with the valid choices) or duplicate key names / keys.

    Example:
        >>> cfg = load_guard_config("examples/guard_modelguard_s.toml")  # doctest: +SKIP
    """
    cfg = load_config(path, GuardConfig, overrides)
    names = [k.name for k in cfg.keys]
    if len(set(names)) != len(names) or len({k.key for k in cfg.keys}) != len(cfg.keys):
        raise ConfigError(f"{path}: keys: names and keys must be unique")
    return cfg


def state_fingerprint(cfg: GuardConfig) -> dict[str, Any]:
    """What the persisted defense state depends on: the model's name and classes and the defense's settings."""
    return {"model": {"name": cfg.model.name, "num_classes": cfg.model.num_classes,
                      "input_shape": list(cfg.model.input_shape)},
            "defense": json.loads(json.dumps(cfg.defense.model_dump(mode="json"), sort_keys=True))}


def fingerprint_diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    """The settings that differ between two fingerprints, as ``"dotted.key: old -> new"`` lines."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new)):
            out += fingerprint_diff(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    return [] if old == new else [f"{prefix.rstrip('.')}: {old!r} -> {new!r}"]
