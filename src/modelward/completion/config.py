"""The completion study file (see examples/completion_*.toml): what to train, which parts, which procedures."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from modelward.completion.problem import ProcedureSpec
from modelward.core.config import StrictModel, load_config, read_toml
from modelward.core.data import DataConfig
from modelward.core.device import DeviceSetting
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig
from modelward.errors import ConfigError


class RetrainConfig(StrictModel):
    """Retraining schedule overrides (the paper's SL retraining schedule is 50% faster, App. A Tables 1–2)."""

    lr: float | None = Field(None, gt=0.0)
    lr_schedule: list[tuple[int, float]] | None = None


class ThresholdConfig(StrictModel):
    """Where ℓ* and L(θ₀) are measured (seed 000 §3.2 uses the test loss; a noisy test peak makes ℓ*_1 a lottery).

    - ``split = "validation"`` (default, supervised studies): a fixed ``val_fraction`` of the training set is held
      out from training; every curve (original and retraining, so ℓ*, L(θ₀), C and C') is measured on it, and the
      test split only reports (the originals' test loss in ``hardness.md``). ``"test"`` is the paper's choice.
      RL studies have no training set: their curves are the evaluation episodes (``[rl] eval_*``), ``split`` is
      not used.
    - ``smoothing`` = w > 1: ℓ* is the minimum of the trailing mean of w evaluations (``metric.Thresholds``).
    """

    split: Literal["validation", "test"] = "validation"
    val_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    smoothing: int = Field(1, ge=1)


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
    # the from-scratch reference T0 (every parameter re-initialised, the original schedule, the same budget) runs
    # once per seed unless `reference = false`; `reference_seeds` restricts it to some seeds (it costs a full
    # training run per seed)
    reference: bool = True
    reference_seeds: list[int] | None = None
    thresholds: ThresholdConfig = Field(default_factory=ThresholdConfig)
    budget: int | None = Field(None, ge=1)  # retraining budget in cost units; None = original training length
    early_stop: bool = True  # stop retraining once the highest-α threshold is reached
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    retrain: RetrainConfig = Field(default_factory=RetrainConfig)
    rl: dict[str, Any] | None = None  # validated by the RL problem (modelward.completion.rl)
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
        if self.reference_seeds is not None and not set(self.reference_seeds) <= set(self.seeds):
            raise ValueError(f"reference_seeds {self.reference_seeds} must be a subset of seeds {self.seeds}")
        clash = [p.name for p in self.procedures if p.name == "T0" and p.kind != "T0"]
        if clash and self.reference:
            raise ValueError("the procedure name 'T0' is the from-scratch reference; rename yours or set "
                             "reference = false")
        return self

    @property
    def all_procedures(self) -> list[ProcedureSpec]:
        """The listed procedures plus the implicit reference T0 (when ``reference`` and none is listed)."""
        if self.reference and not any(p.kind == "T0" for p in self.procedures):
            return [*self.procedures, ProcedureSpec(name="T0", kind="T0")]
        return list(self.procedures)

    def procedure_seeds(self, proc: ProcedureSpec) -> list[int]:
        """The seeds a procedure runs with (T0: ``reference_seeds`` if given)."""
        if proc.kind == "T0" and self.reference_seeds is not None:
            return [s for s in self.seeds if s in self.reference_seeds]
        return list(self.seeds)


def load_study(path: str | Path, overrides: list[str] | None = None) -> StudyConfig:
    """Load a study file; an empty file is refused (it would silently run the whole default study)."""
    if not read_toml(path):
        raise ConfigError(f"{path}: the study file is empty; see examples/completion_digits.toml")
    return load_config(path, StudyConfig, overrides)


def read_study_config(out: str | Path) -> StudyConfig:
    """The configuration a study folder was run with (its ``study.json``)."""
    import json

    return StudyConfig.model_validate(json.loads((Path(out) / "study.json").read_text()))
