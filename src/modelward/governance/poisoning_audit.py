"""The self-audit's poisoning attack (issue 36 items 2 and 7): slow poisoning of the label holder's part through
activations, against real parties, scored on the label holder's real state.

**The attack** (issue 36, item 3). The previous party — Alice, with her data key, and her organisation's control
key to commit — trains Bob's part on batches of his training split in which a fraction of the rows carries *other*
training images' real activations (so the pair activation/label is wrong for those rows, and nothing about the
activations themselves is unusual). The fraction starts at ``start_fraction`` (one row of 64) and grows by
``growth`` (×1.25) after each accepted step; a step Bob refuses or rolls back is aborted and the fraction shrinks
by the same factor (a patient attacker backs off). Without defences, on the demo's split, Bob's test accuracy went
0.978 → 0.283 in 30 attempts and 0.10 in 50.

**The score.** Bob's accuracy (with Alice's honest part in front) before the attack, as the accepted steps left it
when the attack stopped (read from the evidence Bob keeps when he halts, ``<checkpoint_dir>/halted/…``), and after
(Bob's part as he serves it: rolled back after a halt); whether and at which attempt Bob stopped it. Bob's part is
read from the exports his control key asks for and from his evidence folder: the auditor stands in for both
organisations, as in :mod:`~modelward.governance.extraction_audit`.

Example:
    >>> record = slow_poisoning(data_client, control_client, alice_part, bob_part, split,  # doctest: +SKIP
    ...                         bob_dir="runs/audit/parties/bob/checkpoints")
    >>> record.stopped, record.accuracy_before - record.accuracy_at_stop  # doctest: +SKIP
    (True, 0.0)

In the self-audit (``modelward split audit-extraction``) the attack is the registry entry ``slow_poisoning``
(:func:`run`, settings in ``[attacks.options.slow_poisoning]``, keys of :class:`SlowPoisoning`); it commits steps
on Bob, so it runs last.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from pydantic import Field
from torch import nn

from modelward.core.config import StrictModel, validate
from modelward.core.data import DataSplit
from modelward.core.io import load_metadata, load_tensors
from modelward.core.progress import ProgressSink, as_sink
from modelward.errors import ModelwardError
from modelward.governance.integrity import HALTED_DIR
from modelward.governance.neighbour_audit import Point
from modelward.governance.party.config import load_party_config
from modelward.governance.protocol import PartyClient, PartyError, StepRolledBack
from modelward.governance.wire import Message

PROGRESS_KEY = "slow poisoning"


class SlowPoisoning(StrictModel):
    """The attack's settings (module docstring).

    Example:
        >>> SlowPoisoning().growth
        1.25
    """

    attempts: int = Field(100, ge=1)
    start_fraction: float = Field(1 / 64, gt=0.0, le=1.0)
    growth: float = Field(1.25, ge=1.0)
    batch_size: int = Field(64, ge=1)
    seed: int = 0


@dataclass
class PoisoningRecord:
    """What the attack did (module docstring). Accuracies are Bob's part behind Alice's honest part on the test
    split; ``accuracy_at_stop`` is the state the accepted steps left (before any rollback)."""

    attack: str
    attempts: int
    accepted: int
    refused: int
    accuracy_before: float
    accuracy_at_stop: float
    accuracy_after: float
    stopped: bool
    stopped_at: int | None
    rolled_back_to: int | None
    reason: str
    fractions: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _accuracy(bob_part: nn.Module, h_test: torch.Tensor, y_test: torch.Tensor, state: dict[str, torch.Tensor]) -> float:
    """Bob's part in `state` behind Alice's honest activations of the test split."""
    bob_part.load_state_dict(state)
    bob_part.eval()
    with torch.no_grad():
        return float((bob_part(h_test).argmax(1) == y_test).float().mean())


def _export(control: PartyClient) -> dict[str, torch.Tensor]:
    """Bob's part as he holds it now (his control key asks him for an export into his own folder)."""
    path = control.call(Message("checkpoint", meta={"export": True})).meta["export"]  # (his own folder)
    return load_tensors(path)


def _evidence(bob_dir: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
    """The state Bob kept at his latest halt (what the accepted steps left), with its metadata."""
    folders = sorted((bob_dir / HALTED_DIR).glob("step_*"))
    path = folders[-1] / "state_at_halt.safetensors" if folders else None
    if path is None or not path.is_file():
        return None
    tensors = load_tensors(path)
    meta = json.loads(load_metadata(path).get("modelward", "{}"))
    return {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}, meta


def slow_poisoning(data: PartyClient, control: PartyClient, alice_part: nn.Module, bob_part: nn.Module,
                   split: DataSplit, bob_dir: str | Path, settings: SlowPoisoning | None = None,
                   progress: ProgressSink | None = None) -> PoisoningRecord:
    """Run the slow poisoning attack against the label holder (module docstring).

    Args:
        data: a client to Bob with the previous party's identity (its data key): sends the steps.
        control: a client to Bob with the driver's identity (the control key): votes, commits, aborts, exports.
        alice_part: the previous party's trained part (the honest activations; the attacker holds it).
        bob_part: a module with Bob's layers (the auditor loads Bob's exported states into it to score them).
        split: the data (Alice's images, Bob's labels: the auditor's copy, for the batches and the test split).
        bob_dir: Bob's checkpoint_dir (his exports and the evidence of a halt).
        settings: :class:`SlowPoisoning`.
        progress: one unit per attempt.

    Returns:
        A :class:`PoisoningRecord`.
    """
    alice_part.eval()
    with torch.no_grad():  # (what Alice holds: her part's activations of her own images)
        h_train, h_test = alice_part(split.x_train), alice_part(split.x_test)
    return poison_through(data, control, h_train, h_test, split.y_test, bob_part, bob_dir, settings, progress)


def poison_through(data: PartyClient, control: PartyClient, h_train: torch.Tensor, h_test: torch.Tensor,
                   y_test: torch.Tensor, bob_part: nn.Module, bob_dir: str | Path,
                   settings: SlowPoisoning | None = None, progress: ProgressSink | None = None) -> PoisoningRecord:
    """:func:`slow_poisoning` from Alice's activations of her training and test images (`h_train`, `h_test`) and
    the test labels (the auditor's, to score)."""
    s = settings or SlowPoisoning()
    sink = as_sink(progress)
    bob_dir = Path(bob_dir)
    gen = torch.Generator().manual_seed(s.seed)
    n_train = len(h_train)
    before = _accuracy(bob_part, h_test, y_test, _export(control))
    session = "poison-" + secrets.token_hex(4)
    opened = data.call(Message("open", session)).meta
    step, seq = int(opened["step"]), int(opened["last_seq"])
    frac, accepted, refused, fractions = s.start_fraction, 0, 0, []
    stopped_at, reason = None, ""
    sink.start(PROGRESS_KEY, s.attempts, "slow poisoning of the label holder")
    for attempt in range(s.attempts):
        idx = torch.randperm(n_train, generator=gen)[: s.batch_size]
        b = len(idx)
        n = min(b, max(1, round(frac * b)))
        rows = torch.randperm(b, generator=gen)[:n]
        others = torch.randint(0, n_train, (n,), generator=gen)
        h = h_train[idx].clone()
        h[rows] = h_train[others]  # other training images' real activations
        fractions.append(n / b)
        seq += 1
        try:
            data.call(Message("step", session, step, seq, {}, {"h": h.contiguous(), "idx": idx}))
        except StepRolledBack as e:
            refused, reason = refused + 1, str(e)
            control.call(Message("abort", step=step))
            frac = max(s.start_fraction, frac / s.growth)
            continue
        except PartyError as e:
            seq -= 1  # (a refused request does not advance the sequence)
            if "halted" in str(e):
                stopped_at, reason = attempt, str(e)
                break
            refused, reason = refused + 1, str(e)
            frac = max(s.start_fraction, frac / s.growth)
            continue
        try:
            control.call(Message("vote", step=step))
            control.call(Message("commit", step=step))
        except ModelwardError as e:  # a late check refused it: aborted everywhere, the attacker backs off
            refused, reason = refused + 1, str(e)
            control.call(Message("abort", step=step))
            frac = max(s.start_fraction, frac / s.growth)
            continue
        step += 1
        accepted += 1
        frac = min(1.0, frac * s.growth)
        sink.advance(PROGRESS_KEY, 1, f"attempt {attempt}: {n} of {b} rows swapped, accepted")
    after = _accuracy(bob_part, h_test, y_test, _export(control))
    evidence = _evidence(bob_dir) if stopped_at is not None else None
    at_stop = _accuracy(bob_part, h_test, y_test, evidence[0]) if evidence is not None else after
    rolled = None
    if stopped_at is not None:
        st = control.call(Message("status")).meta
        rolled = int(st["step"])
    sink.done(PROGRESS_KEY, f"stopped at attempt {stopped_at}" if stopped_at is not None else "not stopped")
    return PoisoningRecord("slow_poisoning", len(fractions), accepted, refused, before, at_stop, after,
                           stopped_at is not None, stopped_at, rolled, reason, fractions)


class _Context(Protocol):
    """What :func:`run` reads of the self-audit's ``extraction_audit.AuditContext`` (named here, not imported: the
    registry sits above this module)."""

    oracle: Any  # .data (Alice's data key on Bob), .control (the operator's control key)
    victim: Any  # .part (its name), .make_surrogate() (a module with Bob's layers, to load his states into)
    data: DataSplit
    h_train: torch.Tensor
    h_test: torch.Tensor
    settings: Any  # .options["slow_poisoning"]: SlowPoisoning keys
    seed: int
    split: Any  # .party_configs: the running parties' PARTY.toml files, in chain order


def run(ctx: _Context) -> list[Point]:
    """The self-audit's entry (``extraction_audit.ATTACKS``): the slow poisoning against the running label holder
    with Alice's data key and the operator's control key, scored on Bob's real states.

    Returns:
        One :class:`~modelward.governance.neighbour_audit.Point`: ``rows`` = the rows of the attacker's committed
        steps, ``agreement`` = the test accuracy Bob lost by the time the attack stopped (before - at the stop;
        0 is none; chance 0), ``refused`` = Bob halted it; the note has before / at the stop / after.
    """
    options = dict(ctx.settings.options.get("slow_poisoning", {}))
    options.setdefault("seed", ctx.seed)
    s = validate(SlowPoisoning, options, "[attacks.options.slow_poisoning]")
    bob = list(ctx.split.party_configs)[-1]
    bob_dir = load_party_config(ctx.split.party_configs[bob]).checkpoint_dir
    rec = poison_through(ctx.oracle.data, ctx.oracle.control, ctx.h_train, ctx.h_test, ctx.data.y_test,
                         ctx.victim.make_surrogate(), bob_dir, s)
    where = (f"halted at attempt {rec.stopped_at} of {s.attempts}, rolled back to step {rec.rolled_back_to}"
             if rec.stopped else f"not halted in {rec.attempts} attempts")
    note = (f"agreement column = test accuracy lost at the stop; bob's accuracy {rec.accuracy_before:.3f} before, "
            f"{rec.accuracy_at_stop:.3f} at the stop, {rec.accuracy_after:.3f} after; {rec.accepted} steps "
            f"accepted, {rec.refused} refused; {where}")
    lost = max(0.0, rec.accuracy_before - rec.accuracy_at_stop)
    return [Point(ctx.victim.part, "slow_poisoning", rec.accepted * s.batch_size, lost, rec.stopped, 0.0, note)]
