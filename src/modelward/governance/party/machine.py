"""A party of a split model: the transport-free state machine (issue 10; seed 000 §1).

A party holds one contiguous segment of the model, its optimizer state and its own data column (inputs for the
first party, labels for the last). Tensors travel only between neighbours, peer to peer:

    driver --step(s, idx)--> P0 --step(s, h0, idx)--> P1 … --> P[n-1]  (loss from its labels, backward)
    driver <---- done ------ P0 <-------- g0 -------- P1 … <-- g[n-2]

Each party consents to step s (forward *and* backward) when the step reaches it, before computing; it then
computes its gradients, applies its optimizer step *tentatively* (the state before the step is kept) and checks
the result. Only when every party consented and checked does step s commit anywhere; any refusal or failure
anywhere leads to ``abort(s)``, which restores parameters, optimizer state and BatchNorm statistics bit for bit
(two-phase commit with the driver as coordinator). A party answers its caller before its own update (weight
gradients, optimizer step, check) is done, so that it runs while the parties before it compute; its vote comes
with the next request (see :mod:`.training`). Evaluation and prediction travel the same chain, so every
party, the label holder included, consents to every pass.

What leaves a party passes its release path (:mod:`.release`): the driver sees batch indices, noisy metrics and
committed-window losses, never an activation, a gradient or the loss of one step. What one step can change is
bounded, and the label holder's trend detector halts sustained damage (:mod:`~modelward.governance.integrity`).

Consent is decided from the operation the party executes (:data:`consent.OP_PURPOSE`), never from a field the
caller sends. Who may ask for what is fixed by the chain: data operations (step, eval, predict) come from the
previous party (the driver for the first party), control operations from the driver. Every decision goes into the
hash-chained audit log together with the other parties' latest heads (cross-anchoring).

The party is wiring; each part owns its state and has one job:

- :class:`~.gate.Gate`: the admission path (peer pin → decode → op → order → role → sequence → consent → audit);
- :class:`~.segment.Holding`: the segment, the data column, shapes and input bounds;
- :class:`~.step.TentativeStep`: snapshot, late update, check, rollback, settle; :class:`~.commits.TwoPhase`:
  the committed step, carried commits, votes, aborts; :class:`~.state.PartyState`: checkpoints;
- :class:`~.pipeline.StalenessWindow`: the first party's steps in flight (bounded staleness);
- :class:`~.release.ReleasePath`: what leaves; :class:`~.link.NextLink`: the link to the next party;
- :class:`~.training.TrainingStep`: the training step (phase 1); :class:`~.inference.Inference`: evaluation...;
- this class: the wiring, the dispatch table (:attr:`Party.ops`) and the control operations.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from modelward.core.config import validate
from modelward.core.train import TrainConfig, make_optimizer
from modelward.governance.audit import ANCHOR_OP, Anchoring, AuditLog
from modelward.governance.consent import ConsentChecker, purpose_of
from modelward.governance.flow_policy import Release, role_warnings
from modelward.governance.integrity import PoisoningSuspected, StepIntegrity
from modelward.governance.party.checkpoints import Checkpoints
from modelward.governance.party.commits import TwoPhase
from modelward.governance.party.config import PartyConfig, pins, revoked_path
from modelward.governance.party.gate import Gate
from modelward.governance.party.inference import MAX_RESULTS, Inference
from modelward.governance.party.input_protection import input_protection
from modelward.governance.party.label_protection import reply_protection
from modelward.governance.party.link import AnchorCalls, Connect, NextLink
from modelward.governance.party.pipeline import StalenessWindow
from modelward.governance.party.release import ReleasePath
from modelward.governance.party.segment import Holding
from modelward.governance.party.state import PartyState
from modelward.governance.party.step import Prepared, TentativeStep
from modelward.governance.party.tensors import send_codecs
from modelward.governance.party.training import TrainingStep
from modelward.governance.protocol import ConsentDenied, PartyError
from modelward.governance.trust.identity import normalize_pins
from modelward.governance.trust.revocation import DenyList
from modelward.governance.wire import Message, message_limit

__all__ = ["MAX_RESULTS", "Connect", "Party"]
Operation = Callable[[Message, str], Message]


def _opt_fields(tc: TrainConfig) -> dict[str, Any]:
    """What fixes a party's parameter trajectory (run length and evaluation cadence may change between runs)."""
    return tc.model_dump(mode="json", include={"optimizer", "lr", "momentum", "weight_decay", "lr_schedule"})


class Party:
    """The state machine of one party (no transport). ``handle(caller, bytes) -> bytes`` is the only entry point;
    `caller` is the pinned peer name the transport identified (before anything was decoded).

    Args:
        cfg: the party's configuration (paths resolved).
        connect: how to reach the next party: ``connect(name, address) -> PartyClient``. The transport that hosts
            the party gives it (:func:`modelward.governance.transport.server.grpc_link`: gRPC + mutual TLS with
            this party's certificate, the next party pinned by its fingerprint); without one, a party that has a
            next neighbour refuses data operations.

    Example:
        >>> bob = Party(load_party_config("parties/bob.toml"))  # doctest: +SKIP
        >>> InProcessClient(bob, caller="alice").call(Message("status")).meta["layers"]  # doctest: +SKIP
        ['fc1', 'fc2']
    """

    def __init__(self, cfg: PartyConfig, connect: Connect | None = None) -> None:
        self.cfg = cfg
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.pins = normalize_pins(pins(cfg), f"party {cfg.name}: peers")
        self.deny = DenyList(revoked_path(cfg))  # revoked peer certificates (`party revoke`), checked per request
        self.holding = h = Holding(cfg)
        self.segment, self.params = h.segment, h.params
        self.all_layers, self.is_first, self.is_last = h.all_layers, h.is_first, h.is_last
        self.in_shape, self.out_shape = h.in_shape, h.out_shape
        self._protect = reply_protection(cfg.label_protection, "label_protection" in cfg.model_fields_set,
                                         h.y_train, self.in_shape, cfg.name, self.is_last)
        self.send_codecs = send_codecs(cfg.compression, cfg.name, self.is_first, self.is_last)  # {"h":, "g":}
        # the first party's noise / NoPeek on what it sends (input_protection; None: exact activations)
        self.inputs = input_protection(cfg.input_protection, cfg.name, self.is_first)
        # the largest legitimate message (rows x the widest per-row tensor): the transport drops anything larger
        # before it is buffered, whoever sent it (issue 26); replies from the next party too
        self.message_limit = min(int(cfg.max_message_mb * 2**20) + 65536, message_limit(
            h.limit(), [self.in_shape, self.out_shape, tuple(cfg.input_shape), (cfg.num_classes,)]))
        if connect is not None and hasattr(connect, "max_bytes"):
            connect.max_bytes = self.message_limit
        self.warnings = role_warnings(cfg.name, cfg.prev, cfg.driver, self.is_first)
        # what one step can change is bounded; the label holder's trend detector halts sustained damage (integrity)
        self.integrity = StepIntegrity(cfg.integrity, self.segment, name=cfg.name, label_holder=self.is_last,
                                       receives=not self.is_first, num_classes=cfg.num_classes,
                                       state_dir=cfg.checkpoint_dir)
        self.tentative = t = TentativeStep(cfg.name, self.segment, lambda: self.cfg.max_abs_param,
                                           cfg.update_priority)
        t.pre_update = self.integrity.before_optimizer_step
        self.audit = AuditLog(cfg.audit_db, cfg.name)
        self.consent = ConsentChecker(cfg.policy, self.audit)
        self.lock = threading.RLock()
        self.gate = Gate(self, name=cfg.name, driver=cfg.driver, prev=cfg.prev, audit=self.audit,
                         consent=self.consent, lock=self.lock, max_message_bytes=self.message_limit,
                         refusals_every_s=cfg.audit_refusals_every_s,
                         max_sessions_per_peer=cfg.max_sessions_per_peer,
                         revoked=lambda caller: self.deny.reason(self.pins.get(caller)), next_party=cfg.next)
        self.guard = self.gate.guard
        self._note = ""  # added to the reason of the request's audit record (see the `note` property)
        # what leaves this party, and what it costs its receiver (the label holder's outputs and noisy answers)
        self.out = ReleasePath(cfg.name, cfg.policy, self.audit, protect=lambda: self._protect,
                               predict=Release(cfg.policy.predict, Path(cfg.checkpoint_dir) /
                                               "modelguard_s.safetensors") if self.is_last else None)
        self.link = NextLink(cfg.name, cfg.next, cfg.peers[cfg.next].address if cfg.next else None, connect,
                             self.audit, cfg.max_sessions_per_peer)
        self.ckpt = Checkpoints(cfg.checkpoint_dir, cfg.keep_checkpoints)
        self.ckpt.pinned = lambda: self.integrity.trend.good_step  # the last good state survives pruning
        self.state = PartyState(cfg.name, cfg.layers, self.segment, t, self.integrity, self.ckpt, self.audit)
        # bounded-staleness pipelining (the first party): the steps in flight, oldest first, and their senders
        self.window = StalenessWindow(cfg.name, cfg.next, h, t, self.audit,
                                      link=functools.partial(self.link.open, evict=False), link_seq=self.link.seq,
                                      committed=lambda: self.two.step, carried_commit=lambda m: self.two.carried(m),
                                      commit=lambda s: self.two.commit(s), release=self.out)
        self.window.inputs = self.inputs  # (the pipelined path protects what it sends the same way)
        self.two = TwoPhase(cfg.name, self.is_last, t, self.window, self.out, self.state.save, cfg.checkpoint_every)
        self.training = TrainingStep(cfg.name, h, t, self.two, self.window, self.integrity, self.out,
                                     self._next_call, self.send_codecs, self.inputs)  # (its update check: t.extra_check)
        self.inference = Inference(cfg, h, self.window, self.two, self.out, self._next_call, self.inputs)
        # the dispatch table (Flower's _registered_funcs): operation -> bound method, nothing built from strings
        self.ops: dict[str, Operation] = {
            "open": self.op_open, "status": self.op_status, "step": self.training.step, "vote": self.op_vote,
            "commit": self.op_commit, "abort": self.op_abort, "eval": self.inference.eval,
            "predict": self.inference.predict, "fetch": self.inference.fetch, "restore": self.op_restore,
            "checkpoint": self.op_checkpoint, ANCHOR_OP: self.op_anchor,
        }
        # the first optimizer in a process imports a lot of torch; pay that before READY, not on the first request
        make_optimizer([torch.nn.Parameter(torch.zeros(1))], TrainConfig()).step()
        latest = self.ckpt.list()
        if latest:
            self._restore(latest[-1])
        else:
            self._save_checkpoint()
        # every audit record of this party and of its neighbours is anchored in the other's log within
        # anchor_every_s, across restarts and moves (audit.Anchoring: the exchange both ways, addresses proven)
        self.listen_address: str | None = None  # where this party's server listens (set by the transport)
        self._anchor_calls = AnchorCalls(lambda: self.link.connect)
        neighbours = {n: (self.next_address if n == cfg.next else cfg.peers[n].address)
                      for n in (cfg.prev, cfg.next) if n is not None}
        self.anchoring = Anchoring(self.audit, neighbours if connect is not None else {}, self._anchor_calls,
                                   lambda: self.listen_address, cfg.anchor_every_s,
                                   store=Path(cfg.checkpoint_dir) / "neighbours.json", on_switch=self._moved,
                                   name=f"anchor-{cfg.name}")
        self.audit.on_record = self.anchoring.on_record

    # ----------------------------------------------------------------- the parts, as tests and tools reach them
    name = property(lambda self: self.cfg.name, doc="The party's name (its certificate's identity).")
    step = property(lambda self: self.two.step, doc="The committed step count.")
    prepared = property(lambda self: self.tentative.prepared, doc="The newest step applied tentatively, if any.")
    results = property(lambda self: self.inference.results, doc="Prediction results kept for their receiver.")
    next_client = property(lambda self: self.link.client, doc="The data link's client, once connected.")
    link_seq = property(lambda self: self.link.seq, doc="Session -> last sequence number towards the next party.")

    _connect = property(lambda self: self.link.connect, lambda self, c: setattr(self.link, "connect", c),
                        doc="How the next party is reached (tests swap it for a flaky link, then reconnect()).")
    next_address = property(lambda self: self.link.address, lambda self, a: setattr(self.link, "address", a),
                            doc="Where the next party listens (None: unknown until the driver says).")

    @property
    def note(self) -> str:
        """What the current request adds to its audit record: commits it carried, what crossed compressed, and
        what it released (the charges the ledger reads back)."""
        return self._note + self.two.note + self.training.note + self.out.note

    @note.setter
    def note(self, value: str) -> None:
        self._note, self.two.note, self.training.note, self.out.note = value, "", "", ""

    def _moved(self, name: str, address: str) -> None:
        """The next party answered at a new address (proven by its pin): the data link goes there too."""
        if name == self.cfg.next:
            with self.lock:
                self.link.moved(address)

    # ----------------------------------------------------------------- requests (the gate's Handler)
    def handle(self, caller: str, data: bytes) -> bytes:
        """Admit one request through the :class:`~.gate.Gate` (peer check, decode, role, sequence and consent
        checks, dispatch, audit). Raises ModelwardError subclasses on refusal (the transport maps them)."""
        return self.gate.handle(caller, data)

    def dispatch(self, op: str, msg: Message, caller: str) -> Message:
        """Run operation `op` from the dispatch table (the gate has admitted it)."""
        self.note = ""
        err = self.ckpt.take_error()
        if err:
            raise PartyError(f"party {self.cfg.name}: {err}")
        try:
            return self.ops[op](msg, caller)
        except PoisoningSuspected:
            if self.integrity.halt is not None and self.integrity.halt.restored_step is None:
                self._halt()  # once: the first refusal of a halt rolls back (also after a restart in between)
            raise

    def _halt(self) -> None:
        """After the trend detector's alarm (the suspect step is undone already): the state the accepted steps left
        is kept as evidence, the checkpoints after the last step in control are set aside, and the party goes back
        to the last good one (integrity.StepIntegrity.roll_back_to_good)."""
        self.rest(save=False)
        self._restore(self.integrity.roll_back_to_good(self.checkpoints(), lambda: self._state_tensors()))
        self.audit.append(self.cfg.name, "halt", step=self.step, decision="error",
                          reason=self.integrity.halt.message(), purpose=purpose_of("step"))  # type: ignore[union-attr]

    def settle(self) -> None:
        """Wait for the late part of the prepared step; a failed check is rolled back and recorded (the step is
        refused from now on, its loss dropped)."""
        failed = self.tentative.settle()
        if failed is not None:
            self.out.aborted(failed.step)
            self.integrity.rewind(failed.step)
            caller, session, seq = failed.request
            self.audit.append(caller, "step", session, failed.step, seq, decision="error",
                              reason=f"{failed.reason} (found by the check after the input gradient was sent; the "
                                     "step is refused)", purpose=purpose_of("step"))

    # ----------------------------------------------------------------- checkpoints
    def checkpoints(self) -> list[int]:
        return self.ckpt.list()

    def _state_tensors(self, buffers: dict[str, torch.Tensor] | None = None, snap: Prepared | None = None
                       ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        return self.state.tensors(self.step, buffers, snap)

    def _save_checkpoint(self) -> Path:
        return self.state.save(self.step)

    def _restore(self, step: int) -> None:
        self.two.step = self.state.restore(step)
        self.out.restored()

    def state_digest(self) -> str:
        """sha256 over parameters, buffers and optimizer state: equal digests = bit-identical state."""
        with self.lock:
            self.settle()
            return self.state.digest(self.step)

    def _status(self, digest: bool = False) -> dict[str, Any]:
        t = self.tentative
        return {"party": self.cfg.name, "layers": self.cfg.layers, "all_layers": self.all_layers,
                "first": self.is_first, "last": self.is_last, "prev": self.cfg.prev, "next": self.cfg.next,
                "step": self.step, "in_shape": list(self.in_shape), "out_shape": list(self.out_shape),
                "n_train": self.holding.n("train"), "n_test": self.holding.n("test"),
                "prepared": t.all_prepared()[0].step if t.count() else None,
                "in_flight": self.window.in_flight(), "update_priority": t.update_priority,
                "checkpoints": self.checkpoints(), "audit_head": self.audit.head_ref,
                "halted": None if self.integrity.halt is None else self.integrity.halt.message(),
                "digest": self.state_digest() if digest else None,
                "params": {k: list(v.shape) for k, v in self.params.items()}, "link": self.link.stats(),
                "train_cfg": t.train_cfg.model_dump(mode="json") if t.train_cfg else None}

    # ----------------------------------------------------------------- the next party
    def reconnect(self) -> None:
        """Drop the link to the next party (what a real restart of the next party leads to)."""
        self.link.reconnect()

    def _next_call(self, msg: Message, meta: dict, tensors: dict[str, torch.Tensor]) -> Message:
        """The data operation `msg` continued to the next party; the activation passes the release path."""
        if "h" in tensors:
            tensors = {**tensors, "h": self.out.release(self.cfg.next or "", "activation", tensors["h"]).value}
        codecs = {"h": self.send_codecs["h"]} if "h" in self.send_codecs and "h" in tensors else {}
        out, note = self.link.call(msg, meta, tensors, codecs)
        self._note += note
        return out

    # ----------------------------------------------------------------- operations
    def _reply_status(self, op: str, caller: str, meta: dict[str, Any]) -> Message:
        return self.out.reply(op, self.step, meta={k: self.out.release(caller, "status", v) for k, v in meta.items()})

    def op_status(self, msg: Message, caller: str) -> Message:
        """The party's status (with ``meta.digest``: the digest of its state too)."""
        return self._reply_status("status", caller, self._status(bool(msg.meta.get("digest"))))

    def op_open(self, msg: Message, caller: str) -> Message:
        """Start or rejoin a session; a training session fixes the optimizer configuration. The driver may tell
        the party where its next neighbour listens (the neighbour is still pinned by fingerprint)."""
        t = self.tentative
        tc = msg.meta.get("train_cfg")
        if tc is not None and caller != self.cfg.driver:
            raise ConsentDenied(f"party {self.cfg.name}: only the driver ({self.cfg.driver}) opens training sessions")
        if tc is not None:
            cfg = validate(TrainConfig, tc, "train_cfg")
            if t.train_cfg is None:
                t.train_cfg = cfg
                t.opt = make_optimizer(list(self.params.values()), cfg)
            elif _opt_fields(t.train_cfg) != _opt_fields(cfg):
                raise PartyError(f"party {self.cfg.name} is already training with a different optimizer "
                                 f"configuration {_opt_fields(t.train_cfg)}; use a fresh checkpoint_dir to "
                                 "start over")
            n_test = self.holding.n("test")
            ev = min(cfg.eval_batch_size, n_test) if n_test else cfg.eval_batch_size
            self.holding.warm_up([cfg.batch_size, ev] + ([n_test % ev] if n_test and n_test % ev else []))
        addr = msg.meta.get("next_address")
        if addr is not None and caller == self.cfg.driver and self.cfg.next is not None \
                and self.cfg.peers[self.cfg.next].address is None and isinstance(addr, str) and len(addr) < 256:
            self.link.tell_address(addr)
            self.anchoring.told(self.cfg.next, addr)
        return self._reply_status("open", caller, {**self._status(), "last_seq": self.guard.last_seq(caller,
                                                                                                   msg.session)})

    def op_vote(self, msg: Message, caller: str) -> Message:
        """Phase 1's last word on step s from this party, after its late check (waited for before any request)."""
        return self._reply_status("vote", caller, {"vote": self.two.vote(msg.step), "step": self.step})

    def op_commit(self, msg: Message, caller: str) -> Message:
        """Phase 2: keep the prepared step s (idempotent: a repeated commit of the last step is a no-op)."""
        self.tentative.refuse_rolled_back(msg.step)
        self.two.commit(msg.step)
        return self._reply_status("commit", caller, {"step": self.step})

    def op_abort(self, msg: Message, caller: str) -> Message:
        """Phase 2 on a refusal: restore the state before the prepared step s (no-op if nothing is prepared); in a
        pipelined session every step prepared or in flight from s on is undone with it."""
        self.two.abort(msg.step)
        self.integrity.rewind(self.step + self.tentative.count())
        return self._reply_status("abort", caller, {"step": self.step})

    def op_anchor(self, msg: Message, caller: str) -> Message:
        """A neighbour's anchor exchange (audit.Anchoring.accept): its head recorded here if it covers a decision
        not anchored yet, the address it gives for itself noted; our head and address go back."""
        return self._reply_status(ANCHOR_OP, caller, self.anchoring.accept(caller, msg.meta))

    def op_restore(self, msg: Message, caller: str) -> Message:
        """Back to the checkpoint of step ``meta.to_step`` (an uncommitted step is rolled back first)."""
        self.window.reset(0)
        self.tentative.drop()
        self._restore(int(msg.meta.get("to_step", -1)))
        self.window.active = False
        return self._reply_status("restore", caller, {"step": self.step})

    def op_checkpoint(self, msg: Message, caller: str) -> Message:
        """Save a checkpoint now; with meta.export also write export.safetensors (parameters + buffers only) into
        this party's own checkpoint folder — nothing but the path leaves the party."""
        if self.tentative.prepared is not None or self.window.flight:
            busy = self.tentative.prepared.step if self.tentative.prepared is not None else self.window.flight[0].step
            raise PartyError(f"party {self.cfg.name}: step {busy} is prepared or in flight; commit or abort first")
        meta: dict[str, Any] = {"step": self.step, "path": str(self._save_checkpoint())}
        if msg.meta.get("export"):
            meta["export"] = str(self.state.export(self.step))
        return self._reply_status("checkpoint", caller, meta)

    # ----------------------------------------------------------------- stopping
    def rest(self, save: bool = True) -> None:
        """A clean stop's state: the late part of an uncommitted step waited for, then rolled back (the driver
        will abort or restore it anyway), and (`save`) a checkpoint of the current step."""
        with self.lock:
            self.settle()  # a late update still running would otherwise apply itself after the rollback below
            self.window.reset(0)
            self.tentative.drop()
            self.out.aborted()
            if save and self.step not in self.checkpoints():
                self._save_checkpoint()

    def close(self) -> None:
        self.anchoring.close()  # after one last exchange: what this party wrote since the last one is anchored
        self._anchor_calls.close()
        with self.lock:
            self.tentative.close()  # a late update in flight finishes (its step stays prepared)
            self.window.close()
            self.ckpt.close()
            self.link.close()
            self.audit.close()
