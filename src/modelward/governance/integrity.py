"""Integrity of a step (issue 36 item 2): what one step can change is bounded, sustained damage halts the run.

A party trains on tensors its neighbours choose. The numeric check of a party (``max_abs_input``,
``max_abs_param``, non-finite values) stays a hard refusal. Beyond it, nothing is refused as "unusual": the
outlier thresholds of issue 26 refused honest steps (9 in 20,000 demo steps, on Alice's check of the gradient she
receives) and let a patient attacker through (a growing fraction of rows carrying other images' activations took
Bob from 0.978 to 0.28 in 30 steps). Instead, two objects with one job each:

- :class:`~modelward.governance.bounded_influence.BoundedInfluence` bounds what any step can change (per-row
  clipping at the label holder, a cap on every party's step, bounded BatchNorm statistics) — it scales, it never
  refuses;
- :class:`~modelward.governance.trend_detector.TrendDetector` (the label holder) runs a CUSUM on the losses of the
  rows it is about to train on. An alarm **halts** the training at that party: the suspect step is refused, the
  state it left is kept as evidence, the checkpoints after the last step in control are set aside, the party rolls
  back to the last good checkpoint, and it refuses every training step — with the reason and the way on — until
  its operator runs ``modelward party resume PARTY.toml`` (:func:`resume`). The halt is a file
  (``<checkpoint_dir>/halt.json``): it survives restarts, and a driver's ``restore`` does not lift it.

:class:`StepIntegrity` is what the party calls: :meth:`~StepIntegrity.training_loss` (label holder),
:meth:`~StepIntegrity.before_optimizer_step` and :meth:`~StepIntegrity.after_update` (every party). The state of
both objects is a function of the steps committed: it is saved with every checkpoint (as the state before that
checkpoint's step) and rewound with a step that is aborted or rolled back, so a resumed or retried run computes
bit for bit what an uninterrupted one does.

Example:
    >>> seg = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    >>> si = StepIntegrity(IntegrityConfig(), seg, name="bob", label_holder=True, receives=True, num_classes=3,
    ...                    state_dir=None)
    >>> root, loss = si.training_loss(0, seg(torch.randn(16, 4)), torch.randint(0, 3, (16,)))
    >>> sorted(si.state())
    ['influence', 'trend']
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import Field, model_validator
from torch import nn

from modelward.core.config import StrictModel
from modelward.core.io import save_tensors
from modelward.core.records import atomic_write_json
from modelward.errors import ConfigError
from modelward.governance.bounded_influence import BoundedInfluence, InfluenceConfig
from modelward.governance.protocol import PartyError
from modelward.governance.trend_detector import Alarm, TrendConfig, TrendDetector

HALT_FILE = "halt.json"
HALTED_DIR = "halted"

# the keys of issue 26's outlier refusal, and what replaced them
_REMOVED = {
    "max_input_ratio": "integrity.influence.step_multiple / row_multiple (what a step can change is bounded)",
    "max_update_ratio": "integrity.influence.step_multiple (the step is scaled to the cap, not refused)",
    "loss_sigmas": "integrity.trend.threshold (a CUSUM of the rows' losses)",
    "loss_ratio": "integrity.trend.shift_rows", "loss_floor": "integrity.trend.floor_rows",
    "decay": "integrity.influence.step_decay and integrity.trend.decay",
}


class IntegrityConfig(StrictModel):
    """``[integrity]`` of PARTY.toml.

    Args:
        enabled: bound and watch at all (default true). The numeric check is separate and always on.
        warmup_steps: steps that only teach the running averages: the step cap binds and the trend detector arms
            after them (per-row clipping applies from the first step).
        influence: ``[integrity.influence]``, :class:`~modelward.governance.bounded_influence.InfluenceConfig`.
        trend: ``[integrity.trend]``, :class:`~modelward.governance.trend_detector.TrendConfig`.

    Returns:
        A strict config; a key of the removed outlier refusal (``max_input_ratio``, ``max_update_ratio``,
        ``loss_*``, ``decay``) is an error that names the keys replacing it.

    Example:
        >>> IntegrityConfig().trend.threshold
        15.0
    """

    enabled: bool = True
    warmup_steps: int = Field(20, ge=1)
    influence: InfluenceConfig = Field(default_factory=InfluenceConfig)
    trend: TrendConfig = Field(default_factory=TrendConfig)

    @model_validator(mode="before")
    @classmethod
    def _removed_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            old = [k for k in data if k in _REMOVED]
            if old:
                raise ValueError("; ".join(f"integrity.{k} was removed (issue 36: steps are no longer refused as "
                                           f"outliers against running averages): see {_REMOVED[k]}" for k in old)
                                 + " — docs/governance.md, \"Integrity of a step\"")
        return data


class PoisoningSuspected(PartyError):
    """The label holder's trend detector halted the training (the step is refused; see :class:`Halt`)."""


@dataclass
class Halt:
    """A halt of the training at one party: when, why, the last step in control, and where its evidence is."""

    party: str
    step: int
    reason: str
    good_step: int
    time: float
    folder: str
    restored_step: int | None = None
    set_aside: list[int] | None = None

    def message(self) -> str:
        back = (f"it rolled back to its checkpoint of step {self.restored_step}" if self.restored_step is not None
                else f"it rolls back to its last checkpoint at or before step {self.good_step}")
        return (f"party {self.party} halted the training at step {self.step}: suspected poisoning — {self.reason}; "
                f"{back} (the states after it are kept in <checkpoint_dir>/{HALTED_DIR}/{Path(self.folder).name}). "
                f"Training steps are refused until {self.party}'s operator, having looked, runs `modelward party "
                f"resume PARTY.toml`; then `split train` resumes from the latest checkpoint every party holds "
                "(docs/governance.md, \"Integrity of a step\")")


def read_halt(state_dir: Path) -> Halt | None:
    """The halt recorded in `state_dir` (the party's checkpoint_dir), if any."""
    path = Path(state_dir) / HALT_FILE
    if not path.is_file():
        return None
    try:
        return Halt(**json.loads(path.read_text()))
    except (OSError, TypeError, ValueError) as e:
        raise ConfigError(f"{path}: unreadable halt record ({e}); move it away to resume") from None


def resume(state_dir: str | Path) -> Halt:
    """``modelward party resume``: lift the halt recorded in `state_dir` (the party's checkpoint_dir). The record
    moves into its evidence folder (with the time of the resume); a running party notices at its next step and
    records the resume in its audit log.

    Raises:
        ConfigError: nothing is halted there.
    """
    state_dir = Path(state_dir)
    halt = read_halt(state_dir)
    if halt is None:
        raise ConfigError(f"{state_dir}: no halt recorded ({HALT_FILE} absent): nothing to resume")
    folder = Path(halt.folder)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / HALT_FILE, {**asdict(halt), "resumed_at": time.time()})
    (state_dir / HALT_FILE).unlink()
    return halt


class StepIntegrity:
    """The party's side of integrity (module docstring).

    Args:
        cfg: :class:`IntegrityConfig`.
        segment: the party's part.
        name: the party's name (messages).
        label_holder: the party computes the loss (per-row clipping, trend detector).
        receives: its input comes from a neighbour (running statistics bounded).
        num_classes: K.
        state_dir: the party's checkpoint_dir (its halt record and evidence); None: no halt is persisted.

    Example:
        >>> si = StepIntegrity(IntegrityConfig(), torch.nn.Linear(3, 2), name="alice", label_holder=False,
        ...                    receives=False, num_classes=2, state_dir=None)
        >>> si.halt is None
        True
    """

    KEEP = 32  # states before recent steps kept for rewinding (a pipelined party has a few steps prepared)

    def __init__(self, cfg: IntegrityConfig, segment: nn.Module, *, name: str, label_holder: bool, receives: bool,
                 num_classes: int, state_dir: str | Path | None) -> None:
        self.cfg, self.name = cfg, name
        on = cfg.enabled
        self.influence = BoundedInfluence(
            cfg.influence if on else cfg.influence.model_copy(update={"enabled": False}), segment,
            label_holder=label_holder, receives=receives, warmup_steps=cfg.warmup_steps)
        self.trend = TrendDetector(cfg.trend if on and label_holder else cfg.trend.model_copy(update={
            "enabled": False}), num_classes, cfg.warmup_steps)
        self.state_dir = None if state_dir is None else Path(state_dir)
        self._before: dict[int, dict[str, Any]] = {}  # step -> the state before it
        self.halt = read_halt(self.state_dir) if self.state_dir is not None else None

    # ----------------------------------------------------------------- the step
    def training_loss(self, step: int, out: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, float]:
        """The label holder's loss for step `step` (rows clipped) and the loss to report; the rows' losses go to
        the trend detector first. Raises :class:`PoisoningSuspected` on an alarm (the halt is recorded)."""
        self._touch(step)
        root, per_row = self.influence.loss(out, y)
        alarm = self.trend.observe(step, per_row)
        if alarm is not None:
            self._halt(alarm)
        # the loss reported is the batch's mean loss (what an unclipped step reports, the same number)
        return root, float(per_row.mean()) if self.influence.clipped_rows else float(root.item())

    def before_optimizer_step(self, step: int, params: list[torch.Tensor]) -> None:
        """The step cap, on the gradients about to be applied (``TentativeStep.pre_update``)."""
        self._touch(step)
        self.influence.cap_step(params)

    def after_update(self, before: dict[str, torch.Tensor], live: dict[str, torch.Tensor]) -> None:
        """After the optimizer step and the numeric check: bound the change of the running statistics."""
        self.influence.bound_buffers(before, live)

    # ----------------------------------------------------------------- state
    def _touch(self, step: int) -> None:
        if step not in self._before:
            self._before[step] = self.state()
            for s in sorted(self._before)[:-self.KEEP]:
                del self._before[s]

    def state(self, step: int | None = None) -> dict[str, Any]:
        """Plain values for a checkpoint: the state before step `step` where it has begun, else the current one."""
        if step is not None and step in self._before:
            return json.loads(json.dumps(self._before[step]))
        return {"influence": self.influence.state(), "trend": self.trend.state()}

    def load_state(self, state: dict[str, Any]) -> None:
        """Back to a checkpoint's state (a state saved before issue 36, with other keys, is ignored)."""
        self._before.clear()
        if isinstance(state.get("influence"), dict):
            self.influence.load_state(state["influence"])
        if isinstance(state.get("trend"), dict):
            self.trend.load_state(state["trend"])

    def rewind(self, step: int) -> None:
        """Back to the state before `step` (the steps from `step` on were aborted or rolled back)."""
        if step in self._before:
            saved = self._before[step]
            self.influence.load_state(saved["influence"])
            self.trend.load_state(saved["trend"])
        for s in [s for s in self._before if s >= step]:
            del self._before[s]

    # ----------------------------------------------------------------- halting
    def _halt(self, alarm: Alarm) -> None:
        folder = (self.state_dir / HALTED_DIR / f"step_{alarm.step:08d}") if self.state_dir is not None else Path()
        self.halt = Halt(self.name, alarm.step, alarm.describe(), alarm.good_step, time.time(), str(folder))
        if self.state_dir is not None:
            atomic_write_json(self.state_dir / HALT_FILE, asdict(self.halt))
        raise PoisoningSuspected(self.halt.message())

    def refuse_if_halted(self) -> str:
        """Raise :class:`PoisoningSuspected` while a halt is recorded; returns a note for the audit record when the
        operator has just lifted it (``party resume``), else ""."""
        if self.halt is None:
            return ""
        if self.state_dir is not None and not (self.state_dir / HALT_FILE).is_file():
            halt, self.halt = self.halt, None
            return f"; resumed by the operator after the halt at step {halt.step} (modelward party resume)"
        raise PoisoningSuspected(self.halt.message())

    def roll_back_to_good(self, checkpoints: list[int], evidence: Callable[[], tuple[dict, dict]]) -> int:
        """After an alarm (the suspect step already undone): keep the current state as evidence, set aside the
        checkpoints after the last step in control and return the checkpoint step to restore.

        Args:
            checkpoints: the party's checkpoint steps.
            evidence: ``() -> (tensors, metadata)`` of the current state (what the accepted steps left).

        Returns:
            The latest checkpoint step at or before the last step in control (0 if none).
        """
        assert self.halt is not None and self.state_dir is not None
        h = self.halt
        good = max([c for c in checkpoints if c <= h.good_step], default=0)
        folder = Path(h.folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors, meta = evidence()
        save_tensors(folder / "state_at_halt.safetensors", tensors, {"modelward": json.dumps(meta)})
        later = [c for c in checkpoints if c > good]
        for c in later:
            src = self.state_dir / f"step_{c:08d}.safetensors"
            if src.is_file():
                src.replace(folder / src.name)
        h.restored_step, h.set_aside = good, later
        atomic_write_json(self.state_dir / HALT_FILE, asdict(h))
        return good
