"""The guard's configuration (GUARD.toml): server, model, defense and API keys; what its state depends on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

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
    shutdown_timeout_s: float = Field(10.0, gt=0)  # SIGTERM: requests still running after this are cancelled
    busy_timeout_s: float = Field(5.0, gt=0)  # how long a query-log write waits for another process's lock
    log_retention_days: float | None = Field(None, gt=0)  # query-log rows older than this are deleted; None = keep
    log_max_rows: int | None = Field(None, ge=1000)  # keep at most this many query-log rows; None = no cap


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
    operator: bool = False  # may read GET /v2/guard/status (the detector's verdicts on every key)


class GuardConfig(StrictModel):
    server: ServerSection = Field(default_factory=ServerSection)
    model: ModelSection
    defense: DefenseSection = Field(default_factory=DefenseSection)
    keys: list[KeySection] = Field(min_length=1)
    ownership: OwnershipSection = Field(default_factory=OwnershipSection)
    strip: StripSection = Field(default_factory=StripSection)  # issue 41: STRIP backdoor-trigger monitor


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
