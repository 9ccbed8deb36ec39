"""An extraction evaluation's configuration (``modelward extract run``; examples/extraction_digits.toml) and its
cells: every defense × ε × attack × seed is one run of the study (seed 003 §4.1–4.2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, model_validator

from modelward.core.config import AlgorithmSpec, StrictModel
from modelward.core.data import DataConfig
from modelward.core.device import DeviceSetting
from modelward.core.runner import RunSpec
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig
from modelward.extraction.attacks import ATTACK_STRATEGIES, QUERY_STRATEGIES, SubstituteConfig
from modelward.extraction.defenses import DEFENSES


class VictimConfig(StrictModel):
    """The defended model: architecture, training, temperature, and where it is queried."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=lambda: TrainConfig(steps=400, lr=0.05, batch_size=64))
    victim_fraction: float = Field(0.5, gt=0.0, lt=1.0)  # share of the train split the victim learns from
    temperature: float = Field(1.0, gt=0.0)  # served probabilities are softmax(z / T)
    seed: int = 0
    cache_dir: str = "~/.cache/modelward/extraction"
    serve: bool = False  # query the local victim through the guarded HTTP service (127.0.0.1)
    url: str | None = None  # a remote guarded endpoint instead of a local model
    model_name: str = "victim"
    api_key: str | None = None
    misinformation_steps: int = Field(300, ge=1)  # AM's misinformation model (trained with −log(1 − f̂_y))


class TransferConfig(StrictModel):
    """The attacker's query pool: the held-out part of the victim's train split, uniform noise, or other data."""

    source: Literal["pool", "noise", "data"] = "pool"
    size: int = Field(1000, ge=1)  # for source = "noise"
    data: DataConfig | None = None  # for source = "data" (its train split is the pool)
    seed: int = 123

    @model_validator(mode="after")
    def _needs_data(self) -> TransferConfig:
        if self.source == "data" and self.data is None:
            raise ValueError("transfer.source='data' needs a [transfer.data] table (a data source)")
        return self


class DefenseSpec(AlgorithmSpec):
    """One defense column (``name``, ``params``, ``label``); ``epsilons`` sweeps its ε (ℓ1 budget) — one column
    per value; ``attacks`` restricts the attack rows run against it."""

    epsilons: list[float] = Field(default_factory=list)
    attacks: list[str] = Field(default_factory=list)  # attack rows (labels) to run here; empty = all

    @model_validator(mode="after")
    def _known(self) -> DefenseSpec:
        if self.name not in DEFENSES:
            raise ValueError(f"unknown defense {self.name!r}; valid choices: {sorted(DEFENSES)}")
        bad = sorted(set(self.params) - set(DEFENSES.parameters(self.name)))
        if bad:  # caught at load time rather than in the middle of a study
            raise ValueError(f"defense {self.name!r}: unknown parameter(s) {bad}; "
                             f"valid: {DEFENSES.parameters(self.name)}")
        if any(not 0 <= e <= 2 for e in self.epsilons):
            raise ValueError("epsilons must lie in [0, 2] (ℓ1 distance between probability vectors)")
        return self


class ExtractionAttackSpec(StrictModel):
    """One attack row: a query strategy × an attack strategy (each with its parameters)."""

    query: str = "knockoff"
    strategy: str = "naive"
    query_params: dict[str, Any] = Field(default_factory=dict)
    strategy_params: dict[str, Any] = Field(default_factory=dict)
    label: str | None = None

    @model_validator(mode="after")
    def _known(self) -> ExtractionAttackSpec:
        if self.query not in QUERY_STRATEGIES:
            raise ValueError(f"unknown query strategy {self.query!r}; valid choices: {sorted(QUERY_STRATEGIES)}")
        if self.strategy not in ATTACK_STRATEGIES:
            raise ValueError(f"unknown attack strategy {self.strategy!r}; valid choices: "
                             f"{sorted(ATTACK_STRATEGIES)}")
        for kind, reg, name, params in (("query", QUERY_STRATEGIES, self.query, self.query_params),
                                         ("strategy", ATTACK_STRATEGIES, self.strategy, self.strategy_params)):
            bad = sorted(set(params) - set(reg.parameters(name)))
            if bad:
                raise ValueError(f"{kind} {name!r}: unknown parameter(s) {bad}; valid: {reg.parameters(name)}")
        return self

    @property
    def key(self) -> str:
        return self.label or f"{self.query}/{self.strategy}"


class ExtractionConfig(StrictModel):
    """``modelward extract run`` configuration (see examples/extraction_digits.toml)."""

    name: str = "extraction"
    data: DataConfig = Field(default_factory=DataConfig)
    victim: VictimConfig = Field(default_factory=VictimConfig)
    transfer: TransferConfig = Field(default_factory=TransferConfig)
    budget: int = Field(500, ge=1)
    substitute: SubstituteConfig = Field(default_factory=SubstituteConfig)
    substitute_model: ModelConfig | None = None  # None = the victim's architecture (the paper's assumption)
    defenses: list[DefenseSpec] = Field(default_factory=lambda: [DefenseSpec(name="none")])
    attacks: list[ExtractionAttackSpec] = Field(default_factory=lambda: [ExtractionAttackSpec()])
    seeds: list[int] = Field(default_factory=lambda: [0])
    centroid_epsilons: list[float] = Field(default_factory=list)  # ModelGuard-S growth curves (Fig. 5 right)
    threads: int = Field(1, ge=1)  # torch intra-op threads (small models run best single-threaded)
    # where the victim and the substitutes train (docs/devices.md); answers, defenses and the served victim
    # stay on the CPU. Not part of the evaluation's fingerprint: it may resume on another device
    device: DeviceSetting = "cpu"

    @model_validator(mode="after")
    def _check(self) -> ExtractionConfig:
        if not self.defenses:
            raise ValueError("defenses: need at least one [[defenses]] entry")
        if not self.attacks:
            raise ValueError("attacks: need at least one [[attacks]] entry")
        if not self.seeds:
            raise ValueError("seeds: need at least one seed")
        labels = [a.key for a in self.attacks]
        if len(set(labels)) != len(labels):
            raise ValueError(f"attacks: duplicate rows {labels}; give repeated strategies distinct 'label's")
        for i, d in enumerate(self.defenses):
            bad = sorted(set(d.attacks) - set(labels))
            if bad:
                raise ValueError(f"defenses.{i}.attacks: unknown attack rows {bad}; valid: {labels}")
        keys = [(d.label or d.name, e) for d in self.defenses for e in (d.epsilons or [None])]
        if len(set(keys)) != len(keys):
            raise ValueError("defenses: two entries give the same column (label, ε); use distinct labels or ε")
        if self.victim.url and len(self.defenses) != 1:
            raise ValueError("victim.url: a remote victim runs one defense; list exactly that one in [[defenses]] "
                             "(the adaptive attacker's replica)")
        return self


@dataclass(frozen=True)
class Cell:
    defense: DefenseSpec
    epsilon: float | None
    attack: ExtractionAttackSpec
    seed: int

    @property
    def defense_key(self) -> str:
        base = self.defense.label or self.defense.name
        return base if self.epsilon is None else f"{base}@{self.epsilon:g}"

    @property
    def run_id(self) -> str:
        return f"{self.defense_key}|{self.attack.key}|s{self.seed}"

    def spec(self) -> dict[str, Any]:
        return {"defense": self.defense.model_dump(mode="json"), "epsilon": self.epsilon,
                "attack": self.attack.model_dump(mode="json"), "seed": self.seed}


def cells(cfg: ExtractionConfig) -> list[Cell]:
    out = []
    for d in cfg.defenses:
        for eps in (d.epsilons or [None]):
            for a in cfg.attacks:
                if d.attacks and a.key not in d.attacks:
                    continue
                for s in cfg.seeds:
                    out.append(Cell(d, eps, a, s))
    return out


def cell_from_spec(spec: dict[str, Any]) -> Cell:
    """The cell a ledger spec (:meth:`Cell.spec`) describes."""
    return Cell(DefenseSpec.model_validate(spec["defense"]), spec["epsilon"],
                ExtractionAttackSpec.model_validate(spec["attack"]), int(spec["seed"]))


def plan(cfg: ExtractionConfig) -> list[RunSpec]:
    """Every cell as a run (cells are independent: no dependencies)."""
    return [RunSpec(c.run_id, c.spec()) for c in cells(cfg)]
