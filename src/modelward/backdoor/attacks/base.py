"""What every backdoor attack does: poison a training set (a fraction of rows gets the trigger, and for the
dirty-label attacks the target label), and stamp the trigger on test inputs.

Contract of a :class:`BackdoorAttack`:

- ``poison(x, y)`` returns a :class:`PoisonedSet` of the same size as ``(x, y)``: the rows of ``poisoned`` carry
  the trigger (and, dirty-label, the ``target`` label; clean-label, their own label, which is ``target``); rows
  of ``cover`` (WaNet's noise mode) are altered but keep their label; every other row is untouched;
- the poisoned rows are ``round(rate · n)`` rows drawn with a ``torch.Generator`` seeded with ``seed`` from the
  rows the attack may use (dirty-label: rows whose label is not the target; clean-label: rows of the target);
- ``apply(x)`` is the trigger the attacker uses at test time;
- :func:`attack_success_rate` counts the test rows not of the target class that the triggered input sends to the
  target (the attack success rate, ASR, as BackdoorBench reports it).
"""

from __future__ import annotations

from abc import ABC
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from modelward.backdoor.triggers import Trigger
from modelward.core.modules import batched_logits
from modelward.errors import ConfigError


@dataclass(frozen=True)
class PoisonedSet:
    """A poisoned training set.

    Attributes:
        x, y: the training inputs and labels as the victim receives them.
        poisoned: bool per row, the rows that carry the trigger (what data-level detection should find).
        cover: bool per row, rows altered without carrying the trigger (WaNet's noise mode); not poison.
        target: the attack's target class.
    """

    x: torch.Tensor
    y: torch.Tensor
    poisoned: torch.Tensor
    cover: torch.Tensor
    target: int

    @property
    def n_poisoned(self) -> int:
        return int(self.poisoned.sum())


class BackdoorAttack(ABC):
    """Base class: a trigger, a target class and a poisoning rate.

    Args:
        target: the class triggered inputs should be sent to.
        rate: the fraction of the training set that is poisoned (of all rows, as BackdoorBench counts it).
        seed: seeds the choice of rows (and anything else random in the attack).
    """

    name: ClassVar[str]
    dirty_label: ClassVar[bool] = True

    def __init__(self, trigger: Trigger, target: int = 0, rate: float = 0.1, seed: int = 0) -> None:
        if not 0.0 < rate < 1.0:
            raise ConfigError(f"backdoor attack {self.name}: rate must be in (0, 1), got {rate}")
        if target < 0:
            raise ConfigError(f"backdoor attack {self.name}: target must be a class index ≥ 0, got {target}")
        self.trigger = trigger
        self.target = int(target)
        self.rate = float(rate)
        self.seed = int(seed)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """The test-time trigger."""
        return self.trigger.apply(x)

    def describe(self) -> dict[str, Any]:
        return {"attack": self.name, "target": self.target, "rate": self.rate, "seed": self.seed,
                "trigger": self.trigger.to_dict()}

    def _pick(self, eligible: torch.Tensor, n_total: int, g: torch.Generator) -> torch.Tensor:
        k = int(round(self.rate * n_total))
        if k > len(eligible):
            raise ConfigError(f"backdoor attack {self.name}: rate {self.rate} asks for {k} rows but only "
                              f"{len(eligible)} rows are eligible (clean-label attacks poison rows of the target "
                              "class only: lower the rate)")
        if k == 0:
            raise ConfigError(f"backdoor attack {self.name}: rate {self.rate} poisons no row of {n_total}")
        return eligible[torch.randperm(len(eligible), generator=g)[:k]]

    def poison(self, x: torch.Tensor, y: torch.Tensor) -> PoisonedSet:
        """Poison the training set ``(x, y)`` (see the module docstring)."""
        if int(y.max()) < self.target:
            raise ConfigError(f"backdoor attack {self.name}: target {self.target} is not a class of the data "
                              f"(labels 0..{int(y.max())})")
        g = torch.Generator().manual_seed(self.seed)
        eligible = (y != self.target if self.dirty_label else y == self.target).nonzero().flatten()
        idx = self._pick(eligible, len(y), g)
        x2, y2 = x.clone(), y.clone()
        x2[idx] = self._poison_rows(x[idx], y[idx], g)
        if self.dirty_label:
            y2[idx] = self.target
        poisoned = torch.zeros(len(y), dtype=torch.bool)
        poisoned[idx] = True
        cover = self._cover(x2, y2, poisoned, g)
        return PoisonedSet(x2, y2, poisoned, cover, self.target)

    def _poison_rows(self, x: torch.Tensor, y: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        return self.apply(x)

    def _cover(self, x: torch.Tensor, y: torch.Tensor, poisoned: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        return torch.zeros(len(y), dtype=torch.bool)


@dataclass(frozen=True)
class BackdoorEffect:
    """Clean accuracy and attack success rate of a model, counted (for Clopper–Pearson intervals).

    Attributes:
        clean_correct, clean_n: correct test predictions of n.
        asr_hits, asr_n: triggered non-target test rows classified as the target, of n.
    """

    clean_correct: int
    clean_n: int
    asr_hits: int
    asr_n: int

    @property
    def clean_accuracy(self) -> float:
        return self.clean_correct / max(self.clean_n, 1)

    @property
    def attack_success_rate(self) -> float:
        return self.asr_hits / max(self.asr_n, 1)

    def to_dict(self) -> dict[str, Any]:
        return {"clean_accuracy": self.clean_accuracy, "attack_success_rate": self.attack_success_rate,
                "clean_correct": self.clean_correct, "clean_n": self.clean_n, "asr_hits": self.asr_hits,
                "asr_n": self.asr_n}


def attack_success_rate(model: nn.Module, apply: Any, x: torch.Tensor, y: torch.Tensor, target: int
                        ) -> tuple[int, int]:
    """``(hits, n)``: of the ``n`` test rows whose label is not ``target``, how many ``apply(x)`` sends to ``target``.

    Args:
        model: the classifier; apply: the trigger (a callable on a batch); x, y: clean test data; target: the class.
    """
    keep = y != target
    if not bool(keep.any()):
        return 0, 0
    pred = batched_logits(model, apply(x[keep])).argmax(1)
    return int((pred == target).sum()), int(keep.sum())


def backdoor_effect(model: nn.Module, apply: Any, x: torch.Tensor, y: torch.Tensor, target: int) -> BackdoorEffect:
    """Clean accuracy and ASR of ``model`` on the test set ``(x, y)`` with the trigger ``apply``.

    Example:
        >>> from modelward.backdoor.attacks import BadNets  # doctest: +SKIP
        >>> backdoor_effect(model, BadNets().apply, x_test, y_test, target=0).attack_success_rate  # doctest: +SKIP
    """
    pred = batched_logits(model, x).argmax(1)
    hits, n = attack_success_rate(model, apply, x, y, target)
    return BackdoorEffect(int((pred == y).sum()), len(y), hits, n)
