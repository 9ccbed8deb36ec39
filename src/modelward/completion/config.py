"""The completion study file (see examples/completion_*.toml): what to train, which parts, which procedures."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from modelward.completion.problem import ProcedureSpec
from modelward.core.config import StrictModel, load_config
from modelward.core.data import DataConfig
from modelward.core.device import DeviceSetting
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig
from modelward.errors import ConfigError


class RetrainConfig(StrictModel):
    """Retraining schedule overrides (the paper's SL retraining schedule is 50% faster, App. A Tables 1–2)."""

    lr: float | None = Field(None, gt=0.0)
    lr_schedule: list[tuple[int, float]] | None = None


def _default_procedures() -> list[ProcedureSpec]:
    return [ProcedureSpec(name="T1", kind="T1"), ProcedureSpec(name="T2", kind="T2")]


class StudyConfig(StrictModel):
    """A completion study file (see examples/completion_*.toml).

    Example:
        >>> cfg = StudyConfig(seeds=[0], parts=["fc1"])
        >>> [p.name for p in cfg.procedures]
        ['T1', 'T2']
    """

    name: str = "study"
    kind: Literal["supervised", "rl"] = "supervised"
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    alphas: list[float] = Field(default_factory=lambda: [0.5, 0.8, 0.9, 1.0], min_length=1)
    parts: list[str] = Field(default_factory=list)  # empty = the model's natural parts
    procedures: list[ProcedureSpec] = Field(default_factory=_default_procedures, min_length=1)
    budget: int | None = Field(None, ge=1)  # retraining budget in cost units; None = original training length
    early_stop: bool = True  # stop retraining once the highest-α threshold is reached
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    retrain: RetrainConfig = Field(default_factory=RetrainConfig)
    rl: dict[str, Any] | None = None  # validated by the RL problem (modelward.rl.completion)
    # where every run trains and is evaluated ("auto" is resolved by the process that runs it, e.g. a Ray worker
    # with a GPU); not part of the study's fingerprint: a study may resume on another device (docs/devices.md)
    device: DeviceSetting = "cpu"
    checkpoint_every: int | None = Field(None, ge=1)  # mid-run checkpoints every k steps (long runs survive a crash)

    @field_validator("alphas")
    @classmethod
    def _alphas(cls, v: list[float]) -> list[float]:
        if any(not 0.0 <= a <= 1.0 for a in v):
            raise ValueError("every alpha must be in [0, 1]")
        if len(set(v)) != len(v):
            raise ValueError("alphas must be distinct")
        return sorted(v)

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError("seeds must be distinct")
        return v

    @model_validator(mode="after")
    def _check(self) -> StudyConfig:
        names = [p.name for p in self.procedures]
        if len(set(names)) != len(names):
            raise ValueError(f"procedure names must be distinct, got {names}")
        for p in self.procedures:
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", p.name):
                raise ValueError(f"procedure name {p.name!r}: use letters, digits, '_', '.', '-'")
        if self.kind == "rl" and self.rl is None:
            raise ValueError("kind='rl' needs an [rl] table (environment, agent, steps; see examples/)")
        return self


def load_study(path: str | Path, overrides: list[str] | None = None) -> StudyConfig:
    """Load a study file; an empty file is refused (it would silently run the whole default study)."""
    from modelward.core.config import read_toml

    if not read_toml(path):
        raise ConfigError(f"{path}: the study file is empty; see examples/completion_digits.toml")
    return load_config(path, StudyConfig, overrides)


def read_study_config(out: str | Path) -> StudyConfig:
    """The configuration a study folder was run with (its ``study.json``)."""
    import json

    return StudyConfig.model_validate(json.loads((Path(out) / "study.json").read_text()))
