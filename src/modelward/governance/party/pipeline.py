"""Bounded-staleness pipelining at the first party: its window of steps in flight (issue #27 item 3).

Opt-in, ``meta.stale`` = k on a step (:meth:`StalenessWindow.step`): the first party sends the activations of
step s+1 before the gradient of step s is back (k + 1 steps in flight on its link), its update of each step
applied k steps late on the weights its forward pass used (weight stashing; PipeDream-2BW, Narayanan et al.
2021). A party then keeps up to :data:`MAX_PREPARED` steps prepared at once (the commit of step s travels with a
later step); ``abort(s)`` undoes s and every step after it, a commit keeps every step up to it. Every request
still takes the gate.

:class:`StalenessWindow` owns the steps in flight, the sender threads and what the link to the next party has
answered; it holds only what it needs of its party: the holding, the tentative step, the audit log (its head
travels with each request) and a few callables (the link to the next party, the committed step, the commit).

Example:
    >>> window = StalenessWindow("alice", "bob", holding, tentative, audit, link=party._open_link,
    ...                          link_seq=party.link_seq, committed=lambda: party.step,
    ...                          carried_commit=party._carried_commit, commit=party._commit)  # doctest: +SKIP
    >>> stale = window.staleness(msg)  # doctest: +SKIP
    >>> reply = window.step(msg, stale) if stale else ...  # doctest: +SKIP
    >>> done, anchors = window.step(msg, stale)  # the steps finished by this request  # doctest: +SKIP
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from modelward.core.io import optimizer_to_tensors
from modelward.core.threads import torch_thread_pool
from modelward.core.train import TrainConfig, make_optimizer
from modelward.errors import ModelwardError
from modelward.governance.audit import AuditLog
from modelward.governance.party.release import ReleasePath
from modelward.governance.party.segment import Holding
from modelward.governance.party.step import Prepared, TentativeStep
from modelward.governance.party.tensors import format_of, layout
from modelward.governance.protocol import PartyClient, PartyError, anchors_of
from modelward.governance.wire import Message, WireError, expect

# at most this many steps in flight on the first party's link, and at most MAX_PREPARED steps prepared and not
# committed on any party (a driver that never commits cannot make a party keep snapshots without end);
# PIPELINE_RING rollback buffer sets cover them
MAX_STALENESS = 2
MAX_PREPARED = 6
PIPELINE_RING = 10


@dataclass(eq=False)
class Flight:
    """A step whose forward pass the first party ran and sent on, its gradient not back yet (bounded staleness).

    Attributes:
        step: the step; out: the segment's output (its graph holds the stashed parameters); stash: the parameters
        the forward pass ran on (weight stashing: the backward pass uses them, not the live ones, which later
        updates change); buffers: the segment's buffers before this forward pass (BatchNorm statistics, what an
        abort restores); reply: the next party's answer, on its way; held: a commit carried by this request, kept
        until the next party has answered it (it commits on arrival)."""

    step: int
    out: torch.Tensor
    stash: list[torch.Tensor]
    buffers: dict[str, torch.Tensor]
    reply: Future
    held: int | None


def prepared_state(snap: Prepared, param_keys: list[str], train_cfg: TrainConfig
                   ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The checkpoint tensors of the state a prepared step starts from (a pipelined session commits step s while
    the steps after it are applied already): its snapshot, copied (the rollback buffers are reused), and the
    optimizer it holds, rebuilt on copies of its parameters.

    Args:
        snap: the prepared step (the state before it).
        param_keys: the segment's parameter names, in the optimizer's order.
        train_cfg: the session's training configuration (which optimizer).

    Returns:
        (``model.*`` and ``opt.*`` tensors, the optimizer's skeleton for the checkpoint's metadata).

    Example:
        >>> tensors, skel = prepared_state(tentative.find(4), list(params), train_cfg)  # doctest: +SKIP
    """
    tensors = {f"model.{k}": v.clone() for k, v in snap.model.items()}
    params = [torch.nn.Parameter(snap.model[k].clone()) for k in param_keys]
    opt = make_optimizer(params, train_cfg)
    for i, saved in snap.opt["state"].items():
        opt.state[params[i]] = {k: (v.clone() if torch.is_tensor(v) else copy.deepcopy(v))
                                for k, v in saved.items()}
    for g, saved in zip(opt.param_groups, snap.opt["groups"], strict=True):
        g.update(copy.deepcopy(saved))
    ot, skel = optimizer_to_tensors(opt)
    tensors.update(ot)
    return tensors, skel


class StalenessWindow:
    """The first party's steps in flight on its link to the next party (bounded staleness), and their senders.

    Args:
        name: the party's name (error messages, anchors, thread names).
        next_name: the next party's name (error messages).
        holding: the party's segment, parameters and data column.
        tentative: the party's tentative step (snapshots, update, check, rollback).
        audit: the party's audit log (its head travels with every request to the next party).
        link: ``link(session)``: the client of the link to the next party, connected, `session` open on it (its
            last sequence number in `link_seq`); None where the party cannot reach its next party.
        link_seq: the party's last sequence number per session towards the next party (the party's own dict,
            shared: the window takes numbers from it in order and forgets them all when it resets).
        committed: the party's committed step count (read after a carried commit).
        carried_commit: the party's handling of ``meta.commit`` on a data operation; returns (carried step or
            None, step held until the next party has answered or None).
        commit: keeps the prepared steps up to the given one (the party's commit, its checkpoints included).
        release: the party's release path (the activation sent on passes it), or None.

    Example:
        >>> window.staleness(Message("step", meta={"stale": 1}))  # doctest: +SKIP
        1
        >>> window.in_flight()  # doctest: +SKIP
        []
    """

    def __init__(self, name: str, next_name: str | None, holding: Holding, tentative: TentativeStep,
                 audit: AuditLog, *, link: Callable[[str], PartyClient | None], link_seq: dict[str, int],
                 committed: Callable[[], int],
                 carried_commit: Callable[[Message], tuple[int | None, int | None]],
                 commit: Callable[[int], None], release: ReleasePath | None = None) -> None:
        self.name, self.next_name = name, next_name
        self.holding, self.tentative, self.audit = holding, tentative, audit
        self.release = release  # what leaves for the next party passes the party's release path
        self._link, self.link_seq = link, link_seq
        self._committed, self._carried_commit, self._commit = committed, carried_commit, commit
        self.flight: deque[Flight] = deque()  # the steps in flight, oldest first
        self._sender: ThreadPoolExecutor | None = None
        self._link_through: set[str] = set()  # sessions whose link to the next party answered a pipelined step
        self.inputs: Any = None  # the first party's input protection (party.input_protection), set by the party
        self.active = False  # a pipelined (bounded-staleness) request was accepted since the last restore

    def in_flight(self) -> list[int]:
        """The steps in flight, oldest first.

        Returns:
            Their step numbers (empty outside a pipelined session, and after a drain).
        """
        return [f.step for f in self.flight]

    def staleness(self, msg: Message) -> int:
        """``meta.stale`` of a step: 0 (the exact step, the default) or the number of steps the first party may
        keep in flight on its link (1..MAX_STALENESS). A party that accepts one keeps several steps prepared.

        Args:
            msg: the step request.

        Returns:
            The staleness k (a party that accepts k > 0 is pipelined from now on, until a restore).
        """
        stale = msg.meta.get("stale", 0)
        if not isinstance(stale, int) or isinstance(stale, bool) or not 0 <= stale <= MAX_STALENESS:
            raise WireError(f"meta.stale {stale!r}: valid choices: an integer from 0 (exact) to {MAX_STALENESS}")
        if stale:
            self.active = True
            self.tentative.ring = PIPELINE_RING
        return stale

    def refuse_in_flight(self, op: str) -> None:
        """Refuse operation `op` (an evaluation, a prediction) while steps are in flight (PartyError)."""
        if self.flight:
            raise PartyError(f"party {self.name}: steps {self.in_flight()} are in flight; the "
                             f"driver drains the pipeline (a step with meta.drain) before {op}")

    def reset(self, step: int) -> None:
        """Undo the steps in flight from `step` on (all of them: a later one was computed after an earlier one):
        wait for their requests to the next party to end (none is left on the wire to arrive after the abort that
        follows), and restore the buffers from before the first one's forward pass. The link re-opens its session
        (its sequence number is read again from the next party).

        Args:
            step: the first step undone (every step in flight is).
        """
        if not self.flight:
            return
        for f in self.flight:
            try:
                f.reply.result()
            except BaseException:  # noqa: BLE001, S110 - the step is undone whatever its answer was
                pass
        with torch.no_grad():  # (a prepared step rolled back after this restores earlier buffers still)
            for k, v in self.flight[0].buffers.items():
                self.tentative.live[k].copy_(v)
        self.flight.clear()
        self.link_seq.clear()
        self._link_through.clear()

    def _send(self, msg: Message, meta: dict, tensors: dict[str, torch.Tensor]) -> Future:
        """The data operation `msg` continued to the next party without waiting for the answer: the sequence
        number is taken now (in order), the call runs on a sender thread. The next party's gate delivers the
        requests in order (InOrder); until one pipelined request on this link has been answered, a new one waits
        for the one before (the gate only orders a peer's requests once one of them has finished).

        Returns:
            The next party's answer, on its way (a failed future where the next party cannot be reached).
        """
        session = msg.session
        client = self._link(session)
        if client is None:
            return self._failed(PartyError(f"party {self.name}: cannot reach its next party {self.next_name!r}"))
        if session not in self._link_through and len(self.flight):
            try:
                self.flight[-1].reply.result()
            except BaseException:  # noqa: BLE001, S110 - its own landing raises it
                pass
        seq = self.link_seq[session] = self.link_seq[session] + 1
        meta = {**meta, "anchors": {**anchors_of(msg, self.name), self.name: self.audit.head_ref}}
        if self._sender is None:
            self._sender = torch_thread_pool(MAX_STALENESS + 1, f"send-{self.name}")
        return self._sender.submit(client.call, Message(msg.op, session, msg.step, seq, meta, tensors))

    @staticmethod
    def _failed(e: BaseException) -> Future:
        f: Future = Future()
        f.set_exception(e)
        return f

    def step(self, msg: Message, stale: int) -> tuple[list[int], dict]:
        """A pipelined step at the first party, with bounded staleness (``meta.stale`` = k): run the forward
        pass of step s on a copy of the parameters (weight stashing), send the activation on *without waiting for
        its gradient*, then finish the oldest step in flight once more than k are: its gradient (back from the
        next party meanwhile) through the stashed forward pass, and the optimizer step on the live parameters.
        So k + 1 steps are in flight on the link to the next party, and the update of step s uses the gradient
        computed at the parameters before the updates of steps s-k..s-1 — PipeDream-2BW's delayed update
        (Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN Training", ICML, eq. for 2BW:
        W(t+1) = W(t) − ν·∇f(W(t−1)) for k = 1) with weight stashing (Narayanan et al. 2019, "PipeDream",
        SOSP). The parties after the first one compute exactly (their own updates are not delayed).

        ``meta.drain``: no new step; finish every step in flight (before an evaluation, a checkpoint, the end).
        The answer lists the steps finished, ``meta.done = [step, …]``, oldest first; each is prepared
        everywhere (the first party's update checked, the others answered) and is committed like any step: the
        driver carries its commit with a later request. A failure anywhere undoes every step in flight here and
        raises; the driver then settles the last finished step and aborts the rest on every party.

        Args:
            msg: the step request (``meta.stale``, ``meta.drain``, ``meta.commit``, the batch indices).
            stale: its staleness k (:meth:`staleness`, > 0).

        Returns:
            (the steps finished, the heads of the parties after this one): the party's answer (no loss: the
            training loss leaves the label holder only summed over committed steps, :mod:`.release`).
        """
        t, h = self.tentative, self.holding
        drain = msg.meta.get("drain", False)
        if not isinstance(drain, bool):
            raise WireError(f"meta.drain must be true or false, got {drain!r}")
        if drain and msg.meta.get("commit") is not None:
            raise WireError("a drain carries no commit (it reaches no other party); carry it with a step or an "
                            "evaluation")
        carried, held = self._carried_commit(msg)
        at = self._committed() + t.count() + len(self.flight)
        if msg.step != at:
            raise PartyError(f"party {self.name} is at step {at} (committed {self._committed()}, prepared "
                             f"{[p.step for p in t.all_prepared()]}, in flight {self.in_flight()}), "
                             f"request is for step {msg.step}")
        if t.count() - (held is not None) >= MAX_PREPARED:
            raise PartyError(f"party {self.name}: {t.count()} steps prepared and not committed (at most "
                             f"{MAX_PREPARED}); commit them first")
        down: dict = {}
        if not drain:
            idx, x = h.input(msg, "train", h.limit())
            buffers = {k: t.live[k].clone() for k in t.buffer_keys}
            stash = {k: p.detach().clone().requires_grad_(p.requires_grad) for k, p in h.params.items()}
            h.segment.train()
            try:
                out = torch.func.functional_call(h.segment, stash, (layout(x),))
                meta: dict[str, Any] = {"stale": stale} if carried is None else {"stale": stale, "commit": carried}
                sent = out.detach() if self.inputs is None else self.inputs.outgoing(out, x, msg.step)
                h_out = sent if self.release is None else \
                    self.release.release(self.next_name or "", "activation", sent).value
                reply = self._send(msg, meta, {"h": h_out, "idx": idx})
            except BaseException:
                with torch.no_grad():
                    for k, v in buffers.items():
                        t.live[k].copy_(v)
                raise
            self.flight.append(Flight(msg.step, out, [stash[k] for k in h.params], buffers, reply, held))
        done: list[int] = []
        while self.flight and (drain or len(self.flight) > stale):
            step, down = self._land(msg.session)
            done.append(step)
        return done, down

    def _land(self, session: str) -> tuple[int, dict]:
        """Finish the oldest step in flight: its gradient, the backward pass through its stashed forward pass,
        the update of the live parameters and its check; the step is then prepared here.

        Returns:
            (step, the heads of the parties after this one).
        """
        t, h = self.tentative, self.holding
        f = self.flight[0]
        try:
            r = f.reply.result()
            g = h.bounded(expect(r, "g", torch.float32, tuple(f.out.shape)), "gradient g")
            if self.inputs is not None:  # the first party's NoPeek term (input_protection)
                g = self.inputs.incoming(g, f.step)
        except BaseException:
            self.reset(f.step)
            raise
        self._link_through.add(session)
        if f.held is not None:  # the next party committed it on arrival (its vote passed): every party voted
            self._commit(f.held)  # (while this step is still the first in flight: a checkpoint due now is of the
            # state it starts from, its buffers before its forward pass)
        self.flight.popleft()
        snap = t.begin(f.step)()
        with torch.no_grad():
            for k, v in f.buffers.items():  # the state before this step: the buffers before its forward pass
                snap.model[k].copy_(v)
        try:
            wanted = [(p, s) for p, s in zip(h.params.values(), f.stash, strict=True) if s.requires_grad]
            grads = torch.autograd.grad(f.out, [s for _, s in wanted],
                                        g.contiguous(memory_format=format_of(f.out)), allow_unused=True)
            t.opt.zero_grad(set_to_none=True)
            for (p, _), gr in zip(wanted, grads, strict=True):
                p.grad = gr
            t.update(f.step, lambda: snap)
        except BaseException as e:
            t.rollback(snap)
            self.reset(f.step)
            if isinstance(e, ModelwardError):
                t.rolled_back = (f.step, str(e))
            raise
        t.push(snap)
        return f.step, anchors_of(r, self.name)

    def close(self) -> None:
        """Stop the sender threads (a request still queued is cancelled; the party is closing)."""
        if self._sender is not None:
            self._sender.shutdown(wait=False, cancel_futures=True)
