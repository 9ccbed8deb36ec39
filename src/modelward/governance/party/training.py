"""A party's training step: phase 1 of the two-phase commit (forward, the rest of the chain, backward, tentative
update, late check).

Every party after the first answers as soon as its input gradient exists and runs the rest of its step on the
update thread: weight gradients (:mod:`.backward`, nothing computed twice), optimizer step and check, while the
parties before it finish their own backward passes. (The first party, whose caller waits for the answer only, runs
its backward pass and update before answering: nothing would overlap them.) A party's vote on the step is late:
every request first waits for that check (the party's ``settle``), and a failed check rolls the step back and
refuses its commit. The commit of step s-1 travels with step s (``meta.commit``, :class:`~.commits.TwoPhase`).

The answer carries the gradient for the previous party and nothing else: the label holder keeps the step's loss
until the step commits, and only a noisy sum over committed steps ever leaves (:mod:`.release`).

Example:
    >>> op = TrainingStep(cfg, holding, tentative, two_phase, window, integrity, release, forward,
    ...                   send_codecs)  # doctest: +SKIP
    >>> reply = op.step(msg, "alice")  # doctest: +SKIP
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from modelward.governance.integrity import StepIntegrity
from modelward.governance.party.backward import input_gradient
from modelward.governance.party.commits import TwoPhase
from modelward.governance.party.input_protection import InputProtection, protected
from modelward.governance.party.pipeline import MAX_PREPARED, StalenessWindow
from modelward.governance.party.release import ReleasePath
from modelward.governance.party.segment import Holding
from modelward.governance.party.step import TentativeStep
from modelward.governance.party.tensors import format_of, layout
from modelward.governance.protocol import PartyError, anchors_of
from modelward.governance.wire import Codec, Message, expect

Forward = Callable[[Message, dict, dict], Message]


class TrainingStep:
    """The ``step`` operation of one party and the integrity of its update (bounded influence, the trend
    detector).

    Args:
        name: the party's name.
        holding: its segment and data column; tentative: its tentative step; two_phase: its commits.
        window: its staleness window (the first party's pipelined steps).
        integrity: its :class:`~modelward.governance.integrity.StepIntegrity` (the label holder's rows clipped and
            watched, every party's step capped and its running statistics bounded; a halt refuses every step).
        release: its release path (the gradient leaves through it; the label holder's loss is held there).
        forward: ``forward(msg, meta, tensors)``: the step continued to the next party (the party's
            ``_next_call``).
        send_codecs: what the party sends compressed (``{"g": codec}`` for the gradient it returns).

    Attributes:
        note: what the current request adds to its audit record (a pipelined step's finished steps).
    """

    def __init__(self, name: str, holding: Holding, tentative: TentativeStep, two_phase: TwoPhase,
                 window: StalenessWindow, integrity: StepIntegrity, release: ReleasePath, forward: Forward,
                 send_codecs: dict[str, Codec], inputs: InputProtection | None = None) -> None:
        self.name, self.holding, self.tentative, self.two, self.window = name, holding, tentative, two_phase, window
        self.integrity, self.out, self.forward, self.send_codecs = integrity, release, forward, send_codecs
        self.inputs = inputs  # the first party's input protection (noise / NoPeek on what it sends), or None
        self.note = ""
        tentative.extra_check = self.check

    def check(self, step: int, snap: Any) -> None:
        """After the numeric check of a tentative update: the change of the running statistics is bounded
        (integrity: bounded influence)."""
        t = self.tentative
        self.integrity.after_update({k: snap.model[k] for k in t.buffer_keys}, {k: t.live[k] for k in t.buffer_keys})

    def step(self, msg: Message, caller: str) -> Message:
        """Phase 1 of training step s (module docstring). The state before the step is kept until commit(s) or
        abort(s)."""
        t, h, two = self.tentative, self.holding, self.two
        if t.opt is None:
            raise PartyError(f"party {self.name}: open a training session first")
        stale = self.window.staleness(msg)
        if stale and h.is_first:  # (the first party holds no labels: its steps are bounded, not watched)
            done, down = self.window.step(msg, stale)
            self.note += f"; pipelined (staleness {stale}): finished steps {done}"
            return self.out.reply("step", msg.step, meta={"done": self.out.release(caller, "status", done)},
                                  anchors=down)
        if h.is_last:  # a halt of the training (integrity) refuses every step until the operator lifts it
            self.note += self.integrity.refuse_if_halted()
        carried, held = two.carried(msg)
        at = two.step + t.count()
        if msg.step != at:
            raise PartyError(f"party {self.name} is at step {at}, request is for step {msg.step} "
                             "(resume from a common checkpoint with restore)")
        if t.count() - (held is not None) > (MAX_PREPARED - 1 if stale else 0):
            raise PartyError(f"party {self.name}: step {t.all_prepared()[0].step} is prepared and neither "
                             f"committed nor aborted{' (too many steps prepared at once)' if stale else ''}")
        t.rolled_back = None
        idx, x = h.input(msg, "train", h.limit())
        snapshot = t.begin(msg.step)
        per_row: torch.Tensor | None = None
        loss = 0.0  # (the label holder's, below)
        try:
            h.segment.train()
            inp = None if h.is_first else layout(x).requires_grad_(True)
            out = h.segment(layout(x) if inp is None else inp)
            t.opt.zero_grad(set_to_none=True)
            root_grad: torch.Tensor | None = None
            down: dict[str, list] = {}
            if h.is_last:
                y = h.y_train[idx]
                # rows clipped, and their losses watched by the trend detector first (integrity)
                root, loss = self.integrity.training_loss(msg.step, out, y)
                with torch.no_grad():  # (what may leave once the step commits, summed: release.hold_loss)
                    per_row = F.cross_entropy(out.detach(), y, reduction="none")
            else:
                r = self.forward(msg, {} if carried is None else {"commit": carried},
                                 {"h": protected(self.inputs, out, x, msg.step), "idx": idx})
                if held is not None:  # every party after this one has committed it
                    two.held(held, msg.op, buffers=snapshot().model)
                g = h.bounded(expect(r, "g", torch.float32, tuple(out.shape)), "gradient g")
                if self.inputs is not None:  # (its NoPeek term joins the gradient it back-propagates)
                    g = self.inputs.incoming(g, msg.step)
                root, root_grad = out, g.contiguous(memory_format=format_of(out))
                down = anchors_of(r, self.name)
            grad = None
            if inp is None:  # the first party: its whole backward pass is its own
                weight_pass = functools.partial(torch.autograd.backward, root, root_grad)
            else:  # only what the previous party waits for; the weight gradients follow on the update thread
                # (from the gradients the input pass recorded at the weights' branch points: nothing computed twice)
                (grad,), weights = input_gradient(root, [inp], h.grad_params, root_grad)
                weight_pass = weights.run
        except BaseException:
            t.rollback(snapshot())  # the state before this step (a held commit stays prepared)
            self.integrity.rewind(msg.step)
            raise
        t.push(snapshot())
        if per_row is not None:
            self.out.hold_loss(msg.step, per_row, loss, idx)
        # the first party's caller (the driver) waits for nothing but the answer, and no party's work overlaps its
        # update (the next step starts with it): it runs the update here, saving the hand-over to the update
        # thread (measured: docs/benchmarks/governance.md). Its check is still this party's late vote
        t.run_late(msg.step, weight_pass, snapshot, (caller, msg.session, msg.seq), here=inp is None)
        if grad is None:
            return self.out.reply("step", msg.step, anchors=down)
        g_out = self.out.release(caller, "gradient", grad, step=msg.step, idx=idx)
        return self.out.reply("step", msg.step, tensors={"g": g_out}, anchors=down,
                              codecs={"g": self.send_codecs["g"]} if "g" in self.send_codecs else {})
