"""Phase 2 of a party's two-phase commit: the committed step, commits carried by data operations, votes, aborts.

A party's vote on step s is late (its check runs after its answer): the commit of step s travels with the next
data operation (``meta.commit``, a step or an evaluation), and each party passes it on only after its own check
passed. The last party commits on arrival (every party has voted by then), the others once the parties after them
have answered (:meth:`TwoPhase.carried`). Committing keeps the prepared steps up to s, writes the checkpoints due,
and lets the steps' training losses join what may leave the label holder (:mod:`.release`); an abort restores the
state before the step and drops its loss (nothing of an aborted step leaves but the gradient the protocol sent).

Example:
    >>> two = TwoPhase("bob", True, tentative, window, release, save, checkpoint_every=10)  # doctest: +SKIP
    >>> carried, held = two.carried(msg)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from modelward.governance.party.pipeline import StalenessWindow
from modelward.governance.party.release import ReleasePath
from modelward.governance.party.step import Prepared, TentativeStep
from modelward.governance.protocol import PartyError
from modelward.governance.wire import Message, WireError

Save = Callable[..., Any]  # save(step, background=..., buffers=..., snap=...)


class TwoPhase:
    """The committed step of one party and the transitions of phase 2.

    Args:
        name: the party's name; is_last: it is the last party (it commits a carried commit on arrival).
        tentative: its tentative step; window: its staleness window (a pipelined session).
        release: its release path (the losses of committed steps may leave, those of aborted ones never).
        save: its checkpoint writer, ``save(step, background=, buffers=, snap=)``.
        checkpoint_every: a checkpoint at every multiple of this many steps.

    Attributes:
        step: the committed step count (the state every party voted for).
        note: what the current request adds to its audit record (a commit carried by it).
    """

    def __init__(self, name: str, is_last: bool, tentative: TentativeStep, window: StalenessWindow,
                 release: ReleasePath, save: Save, checkpoint_every: int) -> None:
        self.name, self.is_last, self.tentative, self.window = name, is_last, tentative, window
        self.release, self.save, self.every = release, save, checkpoint_every
        self.step = 0
        self.note = ""

    def carried(self, msg: Message) -> tuple[int | None, int | None]:
        """The commit of the last step carried by a data operation (``meta.commit``): the last party commits it on
        arrival, the others hold it until the parties after them have answered. Returns (carried step or None,
        held step or None)."""
        carried = msg.meta.get("commit")  # phase 2 of the previous step, carried by this one (saves a round trip)
        if carried is None:
            return None, None
        if not isinstance(carried, int) or isinstance(carried, bool):
            raise WireError(f"meta.commit must be a step number, got {carried!r}")
        t = self.tentative
        t.refuse_rolled_back(carried)
        if not self.is_last and t.find(carried) is not None:
            return carried, carried  # committed once the next party has answered
        self.commit(carried)
        self.note = f"; committed step {carried} (carried by this {msg.op})"  # in this request's record
        return carried, None

    def held(self, held: int | None, op: str, buffers: dict[str, torch.Tensor] | None = None) -> None:
        """Commit a step held by :meth:`carried` now that the parties after this one have answered (`buffers`: the
        buffers after that step, where this request's forward pass has moved them since)."""
        if held is not None:
            self.commit(held, buffers=buffers)
            self.note += f"; committed step {held} (carried by this {op})"

    def commit(self, s: int, buffers: dict[str, torch.Tensor] | None = None) -> None:
        """Keep the prepared step s (idempotent for the last committed step). `buffers`: the buffers as they were
        after step s, where this step's forward pass has moved them since; a checkpoint due now is of that state."""
        t = self.tentative
        if t.find(s) is not None:
            # (pipelined: one commit may keep several steps, and the steps after s may be applied already: a
            # checkpoint due at step m is of the state step m starts from, its snapshot where it is prepared)
            due = [m for m in range(self.step + 1, s + 2) if m % self.every == 0]
            starts: dict[int, Prepared | None] = {m: t.find(m) for m in due}
            t.commit_upto(s)
            self.step = s + 1
            self.release.committed(s)
            for m in due:
                if starts[m] is not None:
                    self.save(m, background=True, snap=starts[m])
                elif self.window.flight:
                    self.save(m, background=True, buffers=self.window.flight[0].buffers)
                else:
                    self.save(m, background=True, buffers=buffers)
        elif not self.committed_already(s):
            raise PartyError(f"party {self.name}: nothing prepared for step {s} (at step {self.step}, "
                             f"prepared {t.prepared.step if t.prepared else None})")

    def committed_already(self, s: int) -> bool:
        """Step `s` is committed here: the last one with nothing prepared after it, or (a pipelined session, where
        a commit may arrive twice while later steps are prepared) any step before the current one."""
        t = self.tentative
        return (t.prepared is None and self.step == s + 1) or (self.window.active and s < self.step)

    def vote(self, s: int) -> str:
        """Phase 1's last word on step s, after the late check: ``prepared`` (or ``committed`` already); a step the
        check rolled back is refused (StepRolledBack)."""
        t = self.tentative
        t.refuse_rolled_back(s)
        if t.find(s) is not None:
            return "prepared"
        if self.committed_already(s):
            return "committed"
        raise PartyError(f"party {self.name}: nothing prepared for step {s} (at step {self.step}, "
                         f"prepared {t.prepared.step if t.prepared else None})")

    def abort(self, s: int) -> None:
        """Phase 2 on a refusal: restore the state before the prepared step s (no-op if nothing is prepared); in a
        pipelined session every step prepared or in flight from s on is undone with it. Their losses are dropped."""
        self.window.reset(s)
        self.tentative.abort(s, committed=self.step)
        self.release.aborted(s)
