"""A party of a split model: the transport-free state machine (issue 10; seed 000 §1).

A party holds one contiguous segment of the model, its optimizer state and its own data column (inputs for the
first party, labels for the last). Tensors travel only between neighbours, peer to peer:

    driver --step(s, idx)--> P0 --step(s, h0, idx)--> P1 … --> P[n-1]  (loss from its labels, backward)
    driver <---- loss ------ P0 <-------- g0 -------- P1 … <-- g[n-2]

Each party consents to step s (forward *and* backward) when the step reaches it, before computing; it then
computes its gradients, applies its optimizer step *tentatively* (the state before the step is kept) and checks
the result. Only when every party consented and checked does step s commit anywhere; any refusal or failure
anywhere leads to ``abort(s)``, which restores parameters, optimizer state and BatchNorm statistics bit for bit
(two-phase commit with the driver as coordinator). A party answers its caller before its own update (weight
gradients, optimizer step, check) is done, so that it runs while the parties before it compute; its vote comes
with the next request (see :meth:`Party.op_step`). Evaluation and prediction travel the same chain, so every
party, the label holder included, consents to every pass; prediction logits stay with the label holder until the
driver fetches them. The driver thus sees batch indices, losses and metrics — never an activation or a gradient.

Consent is decided from the operation the party executes (:data:`consent.OP_PURPOSE`), never from a field the
caller sends. Who may ask for what is fixed by the chain: data operations (step, eval, predict) come from the
previous party (the driver for the first party), control operations from the driver. Every decision goes into the
hash-chained audit log together with the other parties' latest heads (cross-anchoring).

Bounded-staleness pipelining (opt-in, ``meta.stale`` = k on a step) keeps k + 1 steps in flight on the first
party's link, and several steps prepared on every party: see :mod:`~modelward.governance.party.pipeline`.

The party is assembled from five parts, each owning its state:

- :class:`~modelward.governance.party.gate.Gate`: the admission path (peer pin → decode → op → order → role →
  sequence cache → consent → dispatch → audit record);
- :class:`~modelward.governance.party.segment.Holding`: the segment, the data column, shapes and input bounds;
- :class:`~modelward.governance.party.step.TentativeStep`: snapshot, late update, check, rollback, settle;
- :class:`~modelward.governance.party.pipeline.StalenessWindow`: the first party's steps in flight (bounded
  staleness: weight stashing, sending ahead, landing the gradients);
- this class: the operations of the two-phase commit, in a dispatch table (:attr:`Party.ops`).
"""

from __future__ import annotations

import functools
import json
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from modelward.core.config import validate
from modelward.core.io import load_into, optimizer_from_tensors, optimizer_to_tensors, save_tensors
from modelward.core.train import TrainConfig, make_optimizer
from modelward.errors import ModelwardError
from modelward.governance.audit import ANCHOR_OP, Anchoring, AuditLog
from modelward.governance.consent import ConsentChecker, purpose_of
from modelward.governance.flow_policy import Release, keep_outputs, receiver_of, role_warnings
from modelward.governance.integrity import StepIntegrity
from modelward.governance.party.backward import input_gradient
from modelward.governance.party.checkpoints import Checkpoints, state_digest
from modelward.governance.party.config import PartyConfig, pins, revoked_path
from modelward.governance.party.gate import Gate
from modelward.governance.party.input_protection import input_protection
from modelward.governance.party.label_protection import reply_protection
from modelward.governance.party.pipeline import MAX_PREPARED, StalenessWindow, prepared_state
from modelward.governance.party.segment import Holding
from modelward.governance.party.step import Prepared, TentativeStep
from modelward.governance.party.tensors import format_of, layout, send_codecs
from modelward.governance.protocol import (
    ConsentDenied,
    NumericError,
    PartyClient,
    PartyError,
    PartyUnavailable,
    anchors_of,
)
from modelward.governance.trust.identity import normalize_pins
from modelward.governance.trust.revocation import DenyList
from modelward.governance.wire import Message, WireError, expect, message_limit, wire_note

MAX_RESULTS = 16  # prediction results kept for the driver to fetch (oldest dropped)

Connect = Callable[[str, str], PartyClient]
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
        self.holding = Holding(cfg)
        h = self.holding
        self.segment, self.params = h.segment, h.params
        self.all_layers, self.is_first, self.is_last = h.all_layers, h.is_first, h.is_last
        self.in_shape, self.out_shape = h.in_shape, h.out_shape
        self._protect = reply_protection(cfg.label_protection, "label_protection" in cfg.model_fields_set,
                                         h.y_train, self.in_shape, cfg.name, self.is_last)
        self.send_codecs = send_codecs(cfg.compression, cfg.name, self.is_first, self.is_last)  # {"h":, "g":}
        # the first party's noise / NoPeek on what it sends (input_protection; None: exact activations)
        self._inputs = input_protection(cfg.input_protection, cfg.name, self.is_first)
        # the largest legitimate message (rows x the widest per-row tensor): the transport drops anything larger
        # before it is buffered, whoever sent it (issue 26); replies from the next party too
        self.message_limit = min(int(cfg.max_message_mb * 2**20) + 65536, message_limit(
            h.limit(), [self.in_shape, self.out_shape, tuple(cfg.input_shape), (cfg.num_classes,)]))
        if connect is not None and hasattr(connect, "max_bytes"):
            connect.max_bytes = self.message_limit
        self.warnings = role_warnings(cfg.name, cfg.prev, cfg.driver, self.is_first)
        # outlier steps (incoming activations, update norm, loss) are refused and rolled back (integrity)
        self.integrity = StepIntegrity(cfg.integrity)
        self._step_loss: float | None = None
        self.tentative = TentativeStep(cfg.name, self.segment, lambda: self.cfg.max_abs_param,
                                       cfg.update_priority)
        self.tentative.extra_check = self._integrity_check
        self.audit = AuditLog(cfg.audit_db, cfg.name)
        self.consent = ConsentChecker(cfg.policy, self.audit)
        self.lock = threading.RLock()
        self.gate = Gate(self, name=cfg.name, driver=cfg.driver, prev=cfg.prev, audit=self.audit,
                         consent=self.consent, lock=self.lock, max_message_bytes=self.message_limit,
                         refusals_every_s=cfg.audit_refusals_every_s,
                         max_sessions_per_peer=cfg.max_sessions_per_peer,
                         revoked=lambda caller: self.deny.reason(self.pins.get(caller)), next_party=cfg.next)
        self.guard = self.gate.guard
        self.ckpt = Checkpoints(cfg.checkpoint_dir, cfg.keep_checkpoints)
        self.step = 0
        self.note = ""  # added to the reason of the request's audit record (a commit carried by a step)
        self.results: OrderedDict[str, torch.Tensor] = OrderedDict()
        # what of a prediction may leave this party, and to whom (policy.predict; the label holder only)
        self.release = Release(cfg.policy.predict, Path(cfg.checkpoint_dir) / "modelguard_s.safetensors") \
            if self.is_last else None
        self._connect = connect
        self.next_address = cfg.peers[cfg.next].address if cfg.next else None
        self.next_client: PartyClient | None = None
        self.link_seq: dict[str, int] = {}  # session -> last sequence number used towards the next party
        # bounded-staleness pipelining (the first party): the steps in flight, oldest first, and their senders
        self.window = StalenessWindow(cfg.name, cfg.next, h, self.tentative, self.audit,
                                      link=functools.partial(self._open_link, evict=False), link_seq=self.link_seq,
                                      committed=lambda: self.step, carried_commit=self._carried_commit,
                                      commit=self._commit)
        self.window.inputs = self._inputs  # (the pipelined path protects what it sends the same way)
        # the dispatch table (Flower's _registered_funcs): operation -> bound method, nothing built from strings
        self.ops: dict[str, Operation] = {
            "open": self.op_open, "status": self.op_status, "step": self.op_step, "vote": self.op_vote,
            "commit": self.op_commit, "abort": self.op_abort, "eval": self.op_eval, "predict": self.op_predict,
            "fetch": self.op_fetch, "restore": self.op_restore, "checkpoint": self.op_checkpoint,
            ANCHOR_OP: self.op_anchor,
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
        self._anchor_clients: dict[str, tuple[str, PartyClient]] = {}
        neighbours = {n: (self.next_address if n == cfg.next else cfg.peers[n].address)
                      for n in (cfg.prev, cfg.next) if n is not None}
        self.anchoring = Anchoring(self.audit, neighbours if connect is not None else {}, self._anchor_call,
                                   lambda: self.listen_address, cfg.anchor_every_s,
                                   store=Path(cfg.checkpoint_dir) / "neighbours.json", on_switch=self._moved,
                                   name=f"anchor-{cfg.name}")
        self.audit.on_record = self._on_record

    @property
    def name(self) -> str:
        """The party's name (its certificate's identity)."""
        return self.cfg.name

    @property
    def prepared(self) -> Prepared | None:
        """The step applied tentatively and neither committed nor aborted yet, if any."""
        return self.tentative.prepared

    def _integrity_check(self, step: int, snap: Any) -> None:
        """After the numeric check of a tentative update: the update norm (and the label holder's loss) against
        the party's running statistics; an outlier rolls the step back and refuses it (integrity)."""
        if not self.integrity.enabled:
            return
        t = self.tentative
        keys, bufs = t.param_keys, t.buffer_keys
        try:
            self.integrity.after_update([snap.model[k] for k in keys], [t.live[k] for k in keys], self._step_loss,
                                        [snap.model[k] for k in bufs], [t.live[k] for k in bufs])
        except ModelwardError as e:
            raise NumericError(f"party {self.cfg.name}: step {step}: {e}; the step is rolled back and refused") \
                from None

    def _anchor_call(self, name: str, address: str, meta: dict, timeout: float | None) -> dict:
        """One anchor exchange with neighbour `name` at `address` (audit.Anchoring), over a link of its own: an
        exchange that fails while the neighbour restarts must not leave the data link's channel backing off."""
        held = self._anchor_clients.get(name)
        if held is None or held[0] != address:
            if held is not None:
                held[1].close()
            held = self._anchor_clients[name] = (address, self._connect(name, address))
        try:
            return held[1].call(Message(ANCHOR_OP, meta=meta), timeout=timeout).meta
        except ModelwardError:
            self._anchor_clients.pop(name)[1].close()
            raise

    def _moved(self, name: str, address: str) -> None:
        """The next party answered at a new address (proven by its pin): the data link goes there too."""
        if name == self.cfg.next:
            with self.lock:
                if address != self.next_address:
                    self.next_address = address
                    self.reconnect()

    def _on_record(self, op: str, decision: str) -> None:
        """A record whose head no answer carries (a refusal, a failure: the caller gets an error, not a head) is
        anchored by an exchange soon; an allowed request's head travels with its answer."""
        if decision != "allow":
            self.anchoring.poke()

    # ----------------------------------------------------------------- requests (the gate's Handler)
    def handle(self, caller: str, data: bytes) -> bytes:
        """Admit one request through the :class:`~modelward.governance.party.gate.Gate` (peer check, decode,
        role, sequence and consent checks, dispatch, audit). Raises ModelwardError subclasses on refusal (the
        transport maps them to status codes)."""
        return self.gate.handle(caller, data)

    def dispatch(self, op: str, msg: Message, caller: str) -> Message:
        """Run operation `op` from the dispatch table (the gate has admitted it); the label holder's protection
        wraps its step's reply."""
        self.note = ""
        err = self.ckpt.take_error()
        if err:
            raise PartyError(f"party {self.cfg.name}: {err}")
        if op == "step" and self._protect is not None:
            return self._protect(msg, caller, self.ops["step"])
        return self.ops[op](msg, caller)

    def settle(self) -> None:
        """Wait for the late part of the prepared step; a failed check is rolled back and recorded (the step is
        refused from now on)."""
        failed = self.tentative.settle()
        if failed is not None:
            caller, session, seq = failed.request
            self.audit.append(caller, "step", session, failed.step, seq, decision="error",
                              reason=f"{failed.reason} (found by the check after the input gradient was sent; the "
                                     "step is refused)", purpose=purpose_of("step"))

    # ----------------------------------------------------------------- checkpoints
    def checkpoints(self) -> list[int]:
        return self.ckpt.list()

    def _ckpt_path(self, step: int):
        return self.ckpt.path(step)

    def _state_tensors(self, buffers: dict[str, torch.Tensor] | None = None, snap: Prepared | None = None
                       ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """A checkpoint's tensors and metadata: of the live state (`buffers`: the buffers of an earlier moment,
        see :meth:`_commit`), or of the state the prepared step `snap` starts from (a pipelined session:
        :func:`~modelward.governance.party.pipeline.prepared_state`)."""
        t = self.tentative
        meta: dict[str, Any] = {"step": self.step if snap is None else snap.step, "party": self.cfg.name,
                                "layers": self.cfg.layers, "integrity": self.integrity.monitor.state()}
        if snap is not None:
            assert t.train_cfg is not None
            tensors, meta["opt"] = prepared_state(snap, list(self.params), t.train_cfg)
            meta["train_cfg"] = t.train_cfg.model_dump(mode="json")
            return tensors, meta
        tensors = {f"model.{k}": v for k, v in self.segment.state_dict().items()}
        if buffers is not None:  # the buffers of an earlier moment (see _commit)
            tensors.update({f"model.{k}": buffers[k] for k in t.buffer_keys})
        if t.opt is not None and t.train_cfg is not None:
            ot, skel = optimizer_to_tensors(t.opt)
            tensors.update(ot)
            meta["opt"] = skel
            meta["train_cfg"] = t.train_cfg.model_dump(mode="json")
        return tensors, meta

    def _save_checkpoint(self, background: bool = False, buffers: dict[str, torch.Tensor] | None = None,
                         snap: Prepared | None = None):
        # the records of every step in this checkpoint are on stable storage before it is (a step's own record
        # may still be syncing in the background when the step commits; a power cut loses the in-memory state
        # too, and the party restarts from a checkpoint): the writer waits for the audit log's sync first
        tensors, meta = self._state_tensors(buffers, snap)
        return self.ckpt.save(self.step if snap is None else snap.step, tensors, meta, background,
                              before=self.audit.sync)

    def _restore(self, step: int) -> None:
        got = self.ckpt.load(step)
        if got is None:
            raise PartyError(f"party {self.cfg.name} has no checkpoint at step {step} (has {self.checkpoints()})")
        tensors, meta = got
        t = self.tentative
        load_into(self.segment, {k[6:]: v for k, v in tensors.items() if k.startswith("model.")},
                  f"party {self.cfg.name} checkpoint at step {step}")
        self.step = int(meta["step"])
        t.prepared = None
        t.rolled_back = None
        if isinstance(meta.get("integrity"), dict):
            self.integrity.monitor.load_state(meta["integrity"])
        if "train_cfg" in meta:
            t.train_cfg = TrainConfig.model_validate(meta["train_cfg"])
            t.opt = make_optimizer(list(self.params.values()), t.train_cfg)
            optimizer_from_tensors(t.opt, {k: v for k, v in tensors.items() if k.startswith("opt.")}, meta["opt"])
        elif t.opt is not None and t.train_cfg is not None:
            t.opt = make_optimizer(list(self.params.values()), t.train_cfg)  # fresh state, as at step 0

    def state_digest(self) -> str:
        """sha256 over parameters, buffers and optimizer state: equal digests = bit-identical state."""
        with self.lock:
            self.settle()
            return state_digest(self._state_tensors()[0])

    def _status(self, digest: bool = False) -> dict[str, Any]:
        link = self.next_client.stats if self.next_client is not None else None
        t = self.tentative
        return {"party": self.cfg.name, "layers": self.cfg.layers, "all_layers": self.all_layers,
                "first": self.is_first, "last": self.is_last, "prev": self.cfg.prev, "next": self.cfg.next,
                "step": self.step, "in_shape": list(self.in_shape), "out_shape": list(self.out_shape),
                "n_train": self.holding.n("train"), "n_test": self.holding.n("test"),
                "prepared": t.all_prepared()[0].step if t.count() else None,
                "in_flight": self.window.in_flight(),
                "update_priority": t.update_priority,
                "checkpoints": self.checkpoints(), "audit_head": self.audit.head_ref,
                "digest": self.state_digest() if digest else None,
                "params": {k: list(v.shape) for k, v in self.params.items()},
                "link": None if link is None else {"to": self.cfg.next, "sent": link.sent,
                                                   "received": link.received, "raw": link.raw,
                                                   "seconds": link.seconds, "calls": link.calls},
                "train_cfg": t.train_cfg.model_dump(mode="json") if t.train_cfg else None}

    # ----------------------------------------------------------------- the next party
    def reconnect(self) -> None:
        """Drop the link to the next party: the next data operation connects again and re-opens its session
        (what a real restart of the next party leads to)."""
        if self.next_client is not None:
            self.next_client.close()
        self.next_client = None
        self.link_seq.clear()

    def _open_link(self, session: str, evict: bool = True) -> PartyClient | None:
        """The link to the next party, connected, with `session` open on it (its last sequence number, read from
        the next party, in :attr:`link_seq`).

        Args:
            session: the session the next request belongs to.
            evict: forget every session's number once more than 4 x max_sessions_per_peer are kept (the first
                party's staleness window passes False: its requests in flight hold numbers the next party may not
                have seen yet, and a session re-opened now would reuse them).

        Returns:
            The client of the link; None where this party cannot reach its next party (no address, or built
            without `connect`).
        """
        if self.next_address is None or self._connect is None:
            return None
        if self.next_client is None:
            self.next_client = self._connect(self.cfg.next, self.next_address)
        if session not in self.link_seq:
            st = self.next_client.call(Message("open", session))
            if evict and len(self.link_seq) > 4 * self.cfg.max_sessions_per_peer:
                self.link_seq.clear()
            self.link_seq[session] = int(st.meta["last_seq"])
        return self.next_client

    def _next_call(self, msg: Message, meta: dict, tensors: dict[str, torch.Tensor]) -> Message:
        """The data operation `msg` continued to the next party (sequenced per session; the link re-opens after a
        failure). The heads of the parties before us, and ours, travel with it."""
        op, session, step = msg.op, msg.session, msg.step
        if self.next_address is None:
            raise PartyError(f"party {self.cfg.name}: the address of the next party {self.cfg.next!r} is unknown "
                             f"(set [peers.{self.cfg.next}] address, or open the session through the driver)")
        if self._connect is None:
            raise PartyError(f"party {self.cfg.name}: built without a way to reach its next party {self.cfg.next!r} "
                             "(pass connect=, as the transport's server does)")
        try:
            self._open_link(session)
            seq = self.link_seq[session] + 1
            meta = {**meta, "anchors": {**anchors_of(msg, self.cfg.name), self.cfg.name: self.audit.head_ref}}
            codecs = {"h": self.send_codecs["h"]} if "h" in self.send_codecs and "h" in tensors else {}
            sent = Message(op, session, step, seq, meta, tensors, codecs)
            out = self.next_client.call(sent)
            self.link_seq[session] = seq
            if codecs or out.received:  # what crossed this link compressed, in this request's audit record
                self.note += wire_note(out, sent).replace("received", f"{self.cfg.next} returned")
            return out
        except PartyUnavailable:
            self.link_seq.pop(session, None)
            raise

    # ----------------------------------------------------------------- operations
    def op_status(self, msg: Message, caller: str) -> Message:
        """The party's status (with ``meta.digest``: the digest of its state too)."""
        return Message("status", step=self.step, meta=self._status(bool(msg.meta.get("digest"))))

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
            if addr != self.next_address and self.next_client is not None:
                self.next_client.close()
                self.next_client = None
            self.next_address = addr
            self.anchoring.told(self.cfg.next, addr)
        return Message("open", step=self.step,
                       meta={**self._status(), "last_seq": self.guard.last_seq(caller, msg.session)})

    def op_step(self, msg: Message, caller: str) -> Message:
        """Phase 1 of training step s: forward, (the rest of the chain), backward, tentative optimizer step,
        check. The state before the step is kept until commit(s) or abort(s).

        Every party after the first answers as soon as its input gradient exists and runs the rest of its step on
        the update thread: weight gradients (:mod:`.backward`, nothing computed twice), optimizer step and check,
        while the parties before it finish their own backward passes. (The first party, whose caller waits for
        the loss only, runs its backward pass and update before answering: nothing would overlap them.) A
        party's vote on the step is late: every request first waits for that check (:meth:`settle`), and
        a failed check rolls the step back and refuses its commit. The commit of step s-1 travels with step s
        (``meta.commit``): each party passes it on only after its own check passed, the last party commits it on
        arrival (every party has voted for it then), the others once the parties after them have answered. The
        driver's explicit commit is preceded by a ``vote`` round for the same reason."""
        t, h = self.tentative, self.holding
        if t.opt is None:
            raise PartyError(f"party {self.cfg.name}: open a training session first")
        stale = self.window.staleness(msg)
        if stale and self.is_first:  # (its update is checked without a loss: the first party holds no labels)
            self._step_loss = None
            reply = self.window.step(msg, stale)
            self.note += f"; pipelined (staleness {stale}): finished steps {[d[0] for d in reply.meta['done']]}"
            return reply
        carried, held = self._carried_commit(msg)
        at = self.step + t.count()
        if msg.step != at:
            raise PartyError(f"party {self.cfg.name} is at step {at}, request is for step {msg.step} "
                             "(resume from a common checkpoint with restore)")
        if t.count() - (held is not None) > (MAX_PREPARED - 1 if stale else 0):
            raise PartyError(f"party {self.cfg.name}: step {t.all_prepared()[0].step} is prepared and neither "
                             f"committed nor aborted{' (too many steps prepared at once)' if stale else ''}")
        t.rolled_back = None
        idx, x = h.input(msg, "train", h.limit())
        self._step_loss = None
        if not self.is_first:  # an outlier activation is refused before anything is computed (integrity)
            try:
                self.integrity.incoming("h", x)
            except ModelwardError as e:
                raise NumericError(f"party {self.cfg.name}: step {msg.step}: {e}; nothing computed") from None
        snapshot = t.begin(msg.step)
        try:
            self.segment.train()
            inp = None if self.is_first else layout(x).requires_grad_(True)
            out = self.segment(layout(x) if inp is None else inp)
            t.opt.zero_grad(set_to_none=True)
            root_grad: torch.Tensor | None = None
            if self.is_last:
                root = F.cross_entropy(out, h.y_train[idx])
                loss, down = float(root.item()), {}
                self._step_loss = loss  # checked against its running statistics with the update (integrity)
            else:
                r = self._next_call(msg, {} if carried is None else {"commit": carried},
                                    {"h": self._sent(out, x, msg.step), "idx": idx})
                if held is not None:  # every party after this one has committed it
                    self._commit(held, buffers=snapshot().model)
                    self.note += f"; committed step {held} (carried by this {msg.op})"
                    held = None
                g = h.bounded(expect(r, "g", torch.float32, tuple(out.shape)), "gradient g")
                if self._inputs is not None:  # (its NoPeek term joins the gradient it back-propagates)
                    g = self._inputs.incoming(g, msg.step)
                root, root_grad = out, g.contiguous(memory_format=format_of(out))
                loss, down = float(r.meta["loss"]), anchors_of(r, self.cfg.name)
            grad = None
            if inp is None:  # the first party: its whole backward pass is its own (it answers with the loss first)
                weight_pass = functools.partial(torch.autograd.backward, root, root_grad)
            else:  # only what the previous party waits for; the weight gradients follow on the update thread
                # (from the gradients the input pass recorded at the weights' branch points: nothing computed twice)
                (grad,), weights = input_gradient(root, [inp], h.grad_params, root_grad)
                weight_pass = weights.run
        except BaseException:
            t.rollback(snapshot())  # the state before this step (a held commit stays prepared)
            raise
        t.push(snapshot())
        # the first party's caller (the driver) waits for nothing but the loss, and no party's work overlaps its
        # update (the next step starts with it): it runs the update here, saving the hand-over to the update
        # thread (measured: docs/benchmarks/governance.md). Its check is still this party's late vote
        t.run_late(msg.step, weight_pass, snapshot, (caller, msg.session, msg.seq), here=inp is None)
        return Message("step", step=msg.step, meta={"loss": loss, "_anchors": down},
                       tensors={"g": grad} if grad is not None else {},
                       codecs={"g": self.send_codecs["g"]} if grad is not None and "g" in self.send_codecs else {})

    def _sent(self, out: torch.Tensor, x: torch.Tensor, step: int | None = None) -> torch.Tensor:
        """The activation that leaves for the next party: through the first party's input protection, if any."""
        return out.detach() if self._inputs is None else self._inputs.outgoing(out, x, step)

    def _carried_commit(self, msg: Message) -> tuple[int | None, int | None]:
        """The commit of the last step carried by a data operation (``meta.commit``; a step or an evaluation):
        after this party's own check passed (settled before any request), the last party commits it on arrival,
        the others hold it until the parties after them have answered (then every party has voted for it).
        Returns (carried step or None, held step or None)."""
        carried = msg.meta.get("commit")  # phase 2 of the previous step, carried by this one (saves a round trip)
        if carried is None:
            return None, None
        if not isinstance(carried, int) or isinstance(carried, bool):
            raise WireError(f"meta.commit must be a step number, got {carried!r}")
        t = self.tentative
        t.refuse_rolled_back(carried)
        if not self.is_last and t.find(carried) is not None:
            return carried, carried  # committed once the next party has answered
        self._commit(carried)
        self.note = f"; committed step {carried} (carried by this {msg.op})"  # in this request's record
        return carried, None

    def op_vote(self, msg: Message, caller: str) -> Message:
        """Phase 1's last word on step s from this party, after its late check (waited for before any request):
        ``prepared`` (or ``committed`` already); a step the check rolled back is refused (StepRolledBack)."""
        t = self.tentative
        t.refuse_rolled_back(msg.step)
        if t.find(msg.step) is not None:
            vote = "prepared"
        elif self._committed_already(msg.step):
            vote = "committed"
        else:
            raise PartyError(f"party {self.cfg.name}: nothing prepared for step {msg.step} (at step {self.step}, "
                             f"prepared {t.prepared.step if t.prepared else None})")
        return Message("vote", step=self.step, meta={"vote": vote, "step": self.step})

    def op_commit(self, msg: Message, caller: str) -> Message:
        """Phase 2: keep the prepared step s (idempotent: a repeated commit of the last step is a no-op)."""
        self.tentative.refuse_rolled_back(msg.step)
        self._commit(msg.step)
        return Message("commit", step=self.step, meta={"step": self.step})

    def _commit(self, s: int, buffers: dict[str, torch.Tensor] | None = None) -> None:
        """Keep the prepared step s. `buffers`: the buffers as they were after step s, where this step's forward
        pass has moved them since (a commit held during the next step); a checkpoint due now is of that state."""
        t = self.tentative
        if t.find(s) is not None:
            # (pipelined: one commit may keep several steps, and the steps after s may be applied already: a
            # checkpoint due at step m is of the state step m starts from, its snapshot where it is prepared)
            due = [m for m in range(self.step + 1, s + 2) if m % self.cfg.checkpoint_every == 0]
            starts = {m: t.find(m) for m in due}
            t.commit_upto(s)
            self.step = s + 1
            for m in due:
                if starts[m] is not None:
                    self._save_checkpoint(background=True, snap=starts[m])
                elif self.window.flight:
                    self._save_checkpoint(background=True, buffers=self.window.flight[0].buffers)
                else:
                    self._save_checkpoint(background=True, buffers=buffers)
        elif not self._committed_already(s):
            raise PartyError(f"party {self.cfg.name}: nothing prepared for step {s} (at step {self.step}, "
                             f"prepared {t.prepared.step if t.prepared else None})")

    def _committed_already(self, s: int) -> bool:
        """Step `s` is committed here: the last one with nothing prepared after it, or (a pipelined session, where
        a commit may arrive twice while later steps are prepared) any step before the current one."""
        t = self.tentative
        return (t.prepared is None and self.step == s + 1) or (self.window.active and s < self.step)

    def op_abort(self, msg: Message, caller: str) -> Message:
        """Phase 2 on a refusal: restore the state before the prepared step s (no-op if nothing is prepared); in a
        pipelined session every step prepared or in flight from s on is undone with it."""
        self.window.reset(msg.step)
        self.tentative.abort(msg.step, committed=self.step)
        return Message("abort", step=self.step, meta={"step": self.step})

    def op_eval(self, msg: Message, caller: str) -> Message:
        """A metric (sum over the batch) on the label holder's labels; only the number travels back.

        It may carry the commit of the last training step (``meta.commit``, handled as by a step: the evaluation
        then scores the state every party has voted for, and the driver saves its vote and commit rounds)."""
        h = self.holding
        split = h.split_of(msg)
        idx, x = h.input(msg, split, h.limit())
        self.window.refuse_in_flight(msg.op)
        carried, held = self._carried_commit(msg)
        out = h.forward_eval(x)
        if not self.is_last:
            meta = {"split": split, "metric": msg.meta.get("metric", "error")}
            r = self._next_call(msg, meta if carried is None else {**meta, "commit": carried},
                                {"h": self._sent(out, x), "idx": idx})
            if held is not None:  # every party after this one has committed it
                self._commit(held)
                self.note += f"; committed step {held} (carried by this eval)"
            return Message("eval", meta={"sum": float(r.meta["sum"]), "n": int(r.meta["n"]),
                                         "_anchors": anchors_of(r, self.cfg.name)})
        y = h.labels(split)[idx]
        metric = msg.meta.get("metric", "error")
        if metric == "error":
            total = float((out.argmax(1) != y).sum().item())
        elif metric == "cross_entropy":
            total = float(F.cross_entropy(out, y, reduction="sum").item())
        else:
            raise WireError(f"meta.metric {metric!r}: valid choices: error, cross_entropy")
        return Message("eval", meta={"sum": total, "n": len(y)})

    def op_predict(self, msg: Message, caller: str) -> Message:
        """Prediction through the chain. The first party takes indices of its samples (or, from the driver of
        its own organisation, inputs x); the label holder keeps the logits for the driver to fetch."""
        h = self.holding
        limit = h.limit()
        self.window.refuse_in_flight(msg.op)
        if self.is_first and "x" in msg.tensors:
            x = h.bounded(expect(msg, "x", torch.float32, (None, *self.in_shape), limit), "input x")
            idx = torch.arange(len(x))
        else:
            idx, x = h.input(msg, h.split_of(msg), limit)
        out = h.forward_eval(x)
        if not self.is_last:
            r = self._next_call(msg, {"split": msg.meta.get("split", "test")}, {"h": self._sent(out, x), "idx": idx})
            meta = {"token": r.meta["token"], "n": int(r.meta["n"]), "_anchors": anchors_of(r, self.cfg.name)}
            if r.meta.get("kept"):
                meta["kept"] = str(r.meta["kept"])[:512]
            return Message("predict", meta=meta)
        token = secrets.token_hex(16)
        if receiver_of(self.cfg.policy.predict, self.cfg.name) == self.cfg.name and self.cfg.driver != self.cfg.name:
            # the owner keeps its outputs (policy.predict.result_receiver = "owner"): nothing leaves, not even to
            # the driver; they go to this party's own folder
            path = keep_outputs(self.cfg.checkpoint_dir, msg.session, token, out, idx)
            # (the file's name only: where this party keeps its files is none of the caller's business)
            return Message("predict", meta={"token": "", "n": len(out),
                                            "kept": f"{self.cfg.name}: <checkpoint_dir>/predictions/{path.name}"})
        self.results[token] = out
        while len(self.results) > MAX_RESULTS:
            self.results.popitem(last=False)
        return Message("predict", meta={"token": token, "n": len(out)})

    def op_fetch(self, msg: Message, caller: str) -> Message:
        """The receiver the policy names collects a prediction (once), in the owner's form (``policy.predict``:
        the flow policy has checked who asks)."""
        out = self.results.pop(str(msg.meta.get("token", "")), None)
        if out is None:
            raise PartyError(f"party {self.cfg.name}: no prediction result with that token (fetched already, or "
                             f"dropped: at most {MAX_RESULTS} are kept)")
        if self.release is None:
            raise PartyError(f"party {self.cfg.name}: only the label holder releases predictions")
        return Message("fetch", meta={"form": self.cfg.policy.predict.form}, tensors=self.release.release(out))

    def op_anchor(self, msg: Message, caller: str) -> Message:
        """A neighbour's anchor exchange (audit.Anchoring.accept): its head recorded here if it covers a decision
        not anchored yet, the address it gives for itself noted; our head and address go back."""
        return Message(ANCHOR_OP, meta=self.anchoring.accept(caller, msg.meta))

    def op_restore(self, msg: Message, caller: str) -> Message:
        """Back to the checkpoint of step ``meta.to_step`` (an uncommitted step is rolled back first)."""
        self.window.reset(0)
        self.tentative.drop()
        self._restore(int(msg.meta.get("to_step", -1)))
        self.window.active = False
        return Message("restore", step=self.step, meta={"step": self.step})

    def op_checkpoint(self, msg: Message, caller: str) -> Message:
        """Save a checkpoint now; with meta.export also write export.safetensors (parameters + buffers only) into
        this party's own checkpoint folder — nothing but the path leaves the party."""
        if self.tentative.prepared is not None or self.window.flight:
            busy = self.tentative.prepared.step if self.tentative.prepared is not None else self.window.flight[0].step
            raise PartyError(f"party {self.cfg.name}: step {busy} is prepared or in flight; commit or abort first")
        path = self._save_checkpoint()
        meta: dict[str, Any] = {"step": self.step, "path": str(path)}
        if msg.meta.get("export"):
            exp = self.ckpt.dir / "export.safetensors"
            save_tensors(exp, self.segment.state_dict(), {"modelward": json.dumps({"step": self.step,
                                                                                    "party": self.cfg.name})})
            meta["export"] = str(exp)
        return Message("checkpoint", step=self.step, meta=meta)

    # ----------------------------------------------------------------- stopping
    def rest(self) -> None:
        """A clean stop's state: the late part of an uncommitted step waited for, then rolled back (the driver
        will abort or restore it anyway), and a checkpoint of the current step."""
        with self.lock:
            self.settle()  # a late update still running would otherwise apply itself after the rollback below
            self.window.reset(0)
            self.tentative.drop()
            if self.step not in self.checkpoints():
                self._save_checkpoint()

    def close(self) -> None:
        self.anchoring.close()  # after one last exchange: what this party wrote since the last one is anchored
        for _, client in self._anchor_clients.values():
            client.close()
        with self.lock:
            self.tentative.close()  # a late update in flight finishes (its step stays prepared)
            self.window.close()
            self.ckpt.close()
            if self.next_client is not None:
                self.next_client.close()
            self.audit.close()
