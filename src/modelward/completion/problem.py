"""The learning problem a completion study runs on, independent of supervised vs reinforcement learning.

A study (``modelward.completion.study``) only ever sees *curves*: lists of ``(cost, L)`` pairs where cost counts
steps (SL: minibatch updates; RL: environment steps) and L is the loss (SL: test error; RL: −mean return). A
problem knows how to train the original model for a seed and how to retrain it with one part reset.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from modelward.core.config import StrictModel
from modelward.core.init import InitScheme

Curve = list[tuple[int, float]]
OnEval = Callable[[int, float], None]


class ProcedureSpec(StrictModel):
    """A retraining procedure T' (seed 000 §3.3).

    - T0: the from-scratch reference — every parameter re-initialised, the original training schedule, the same
      budget (T ∈ 𝒯, §3.2: "retraining the entire model from scratch … is a valid way to complete the model");
      it does not depend on the part, so a study runs it once per seed;
    - T1: reset the part, train all parameters;   T2: train only the reset part (everything else frozen);
    - T3: T1 with the part over-parametrised (``t3_variant``: ``two_layers`` = two layers with a non-linearity,
      ``wider`` = a factorised layer with a ``t3_factor``× wider inner dimension);
    - T4: T1 with another init scheme (``init``).
    ``lr_schedule`` / ``steps`` override the training schedule (the paper's SL retraining is 50% faster);
    ``keep_buffer`` (RL, replay-based agents) keeps the trained agent's replay buffer for retraining.
    """

    name: str
    kind: Literal["T0", "T1", "T2", "T3", "T4"]
    init: InitScheme = "glorot_uniform"
    t3_variant: Literal["two_layers", "wider"] = "two_layers"
    t3_factor: float = Field(2.0, gt=0.0)
    lr: float | None = Field(None, gt=0.0)
    lr_schedule: list[tuple[int, float]] | None = None
    keep_buffer: bool | None = None

    @property
    def trains_all(self) -> bool:
        return self.kind != "T2"

    @property
    def from_scratch(self) -> bool:
        return self.kind == "T0"


@dataclass
class OriginalRun:
    """Result of training the original model for one seed (and one task, for multi-task RL suites)."""

    seed: int
    task: str
    curve: Curve
    checkpoint: Path  # safetensors with the trained parameters θ_N
    extras: dict[str, Any] = field(default_factory=dict)  # e.g. {"replay_buffer": "<path>"}

    @property
    def loss0(self) -> float:
        return self.curve[0][1]

    @property
    def best(self) -> float:
        return min(v for _, v in self.curve)

    @property
    def steps(self) -> int:
        return self.curve[-1][0]


class CompletionProblem(ABC):
    """What a completion study needs from a learning problem. Implementations must be picklable (they are sent to
    worker processes) and deterministic given the seed."""

    #: task names; a multi-game RL suite has several, MC-hardness is averaged over tasks within each seed
    tasks: list[str] = [""]

    @abstractmethod
    def part_names(self) -> list[str]:
        """Default parts to reset, lower to higher layers."""

    @abstractmethod
    def parts_table(self) -> list[dict[str, Any]]:
        """Rows {part, params, params_excl_norm} for parts.csv."""

    @abstractmethod
    def train_original(self, seed: int, task: str, workdir: Path, on_eval: OnEval | None = None) -> OriginalRun:
        """Train from scratch (procedure T) with `seed`; the curve must start at cost 0 with L(θ₀)."""

    @abstractmethod
    def retrain(self, original: OriginalRun, part: str, procedure: ProcedureSpec, seed: int, budget: int,
                stop_at: float | None, workdir: Path, on_eval: OnEval | None = None) -> Curve:
        """Reset `part` of θ_N (only its parameters change), retrain with `procedure` for at most `budget` cost
        units, stopping at the first evaluation with L ≤ `stop_at`. Returns the curve starting at cost 0."""

    def validate_part(self, part: str) -> None:  # noqa: B027 — optional hook
        """Raise PartError if `part` does not exist (called before any run starts)."""
