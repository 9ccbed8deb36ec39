"""The gate of a party: the admission path every request takes, as one ordered list of small checks.

Who may ask a party for what, and what it records, is decided here and nowhere else (the reference monitor). A
request (the caller's pinned name, which the transport identified, and the raw bytes) goes through
:data:`CHECKS` in this order, each check a function ``check(gate, request, call_next)`` that either refuses (an
audit record, then a :class:`~modelward.errors.ModelwardError`) or hands the request on (Flower's mods around a
dispatch table: ``flwr/client/mod/utils.py`` ``make_ffn``, the last check innermost):

1. :func:`peer_pin`: the caller is an allowed pinned peer whose certificate is not revoked (the party's deny-list,
   ``party revoke``), before a single byte of the body is interpreted;
2. :func:`decode_body`: the bytes decode into a message within the size limit (the audit fields are taken);
3. :func:`op_known`: the operation is one of the protocol's;
4. :func:`in_order`: a pipelined data operation waits for its predecessor; from here on the party's lock is held
   (``with turn, lock:``) and the late part of the prepared step is settled first;
5. :func:`role`: data operations come from the previous party (the driver for the first), control operations
   from the driver;
6. :func:`sequence_cache`: data operations carry the next sequence number; an exact retry gets the cached answer;
7. :func:`consent`: the party's consent policy for this pass, its flow policy last (what may run and what may
   leave: :func:`~modelward.governance.flow_policy.admit`);
8. :func:`audit`: the dispatch runs, and its outcome is recorded (allowed, or failed) in the hash-chained log;
   the answer carries the party's head.

The gate knows nothing of the party beyond a :class:`Handler` (settle, dispatch, the note of the last dispatch).

Example:
    >>> gate = Gate(party, name="bob", driver="driver", prev="alice", audit=log, consent=checker,
    ...             lock=threading.RLock())  # doctest: +SKIP
    >>> reply = gate.handle("alice", request_bytes)  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

from modelward.errors import ModelwardError
from modelward.governance.audit import ANCHOR_OP, AuditLog
from modelward.governance.consent import ConsentChecker, PassRequest, purpose_of
from modelward.governance.flow_policy import request_fields
from modelward.governance.protocol import DATA_OPS, OPS, ConsentDenied, PartyError, anchors_of
from modelward.governance.wire import InOrder, Message, SequenceGuard, WireError, decode, encode, wire_note


class Handler(Protocol):
    """What the gate admits requests to (a party's operations).

    ``settle()`` finishes the late part of the prepared step (called under the lock, before every request);
    ``dispatch(op, msg, caller)`` runs an operation and returns its reply; ``note`` is what the last dispatch adds
    to the reason of its audit record (a commit carried by a step), reset by every dispatch."""

    note: str

    def settle(self) -> None: ...

    def dispatch(self, op: str, msg: Message, caller: str) -> Message: ...


@dataclass
class Request:
    """A request on its way through the gate: filled in by the checks as they go."""

    caller: str
    data: bytes
    msg: Message | None = None
    purpose: str | None = None
    batch: int = 0
    rec: dict[str, Any] = field(default_factory=dict)  # the fields of its audit record
    reason: str = ""  # the consent decision's reason (in the record of an allowed request)


CallNext = Callable[[Request], Any]
Check = Callable[["Gate", Request, CallNext], Any]


def peer_pin(gate: Gate, req: Request, call_next: CallNext) -> bytes:
    """Refuse a caller that is not an allowed pinned peer, or whose pinned certificate is revoked, before a single
    byte of the body is interpreted."""
    peer = gate.consent.check_peer(req.caller)
    # (the next party is pinned by the chain itself: role() admits its one operation, the anchor exchange)
    if not peer.allowed and req.caller != gate.next_party:
        gate.audit.refusal(req.caller, "(undecoded)", peer.reason, gate.refusals_every_s, batch=len(req.data))
        raise ConsentDenied(f"party {gate.name}: {peer.reason}")
    # a revoked certificate (the deny-list is re-read when it changes: a peer revoked while a session runs is
    # refused from its next request on)
    revoked = gate.revoked(req.caller) if gate.revoked is not None else None
    if revoked:
        gate.audit.refusal(req.caller, "(revoked)", revoked, gate.refusals_every_s, batch=len(req.data))
        raise ConsentDenied(f"party {gate.name}: {req.caller!r} is refused: {revoked}")
    return call_next(req)


def decode_body(gate: Gate, req: Request, call_next: CallNext) -> bytes:
    """Decode the message (size-limited) and take the fields of its audit record. Non-finite values pass here:
    the party's magnitude bound catches them (one pass over each tensor instead of two)."""
    try:
        msg = decode(req.data, max_bytes=gate.max_message_bytes, allow_nonfinite=True)
    except WireError as e:
        gate.audit.refusal(req.caller, "(malformed)", str(e), gate.refusals_every_s, batch=len(req.data))
        raise
    op = msg.op
    req.msg = msg
    req.batch = max((v.shape[0] for v in msg.tensors.values() if v.dim()), default=0)
    req.purpose = purpose_of("open_train" if op == "open" and msg.meta.get("train_cfg") is not None else op)
    req.rec = {"session": msg.session, "step": msg.step, "seq": msg.seq, "batch": req.batch,
               "shapes": {k: list(v.shape) for k, v in msg.tensors.items()}, "purpose": req.purpose,
               "anchors": anchors_of(msg, gate.name)}
    return call_next(req)


def op_known(gate: Gate, req: Request, call_next: CallNext) -> bytes:
    """Refuse an operation the protocol does not have."""
    op = req.msg.op
    if op not in OPS:
        gate.audit.refusal(req.caller, "(unknown)", f"unknown operation {op[:64]!r}", gate.refusals_every_s)
        raise WireError(f"unknown operation {op!r}; valid: {', '.join(OPS)}")
    return call_next(req)


def in_order(gate: Gate, req: Request, call_next: CallNext) -> bytes:
    """A caller that pipelines its data operations (the driver sends step s+1 before step s is answered) may have
    them delivered out of order: the later one waits for its predecessor (bounded, see
    :class:`~modelward.governance.wire.InOrder`). Then, under the party's lock, the late part of the prepared step
    is settled (done, or rolled back) before anything else."""
    msg = req.msg
    turn = (gate.order.turn(req.caller, msg.session, msg.seq, lambda: gate.accepted(req.caller, msg.session))
            if msg.op in DATA_OPS and gate.role_ok(req.caller, msg.op) else nullcontext())
    with turn, gate.lock:
        gate.handler.settle()
        return call_next(req)


def role(gate: Gate, req: Request, call_next: CallNext) -> bytes:
    """Refuse an operation from a caller the chain does not give it to."""
    op = req.msg.op
    if not gate.role_ok(req.caller, op):
        reason = (f"{req.caller!r} may not call {op} on {gate.name} (data operations come from "
                  f"{gate.prev or gate.driver!r}, control operations from the driver {gate.driver!r})")
        gate.audit.append(req.caller, op, **req.rec, decision="deny", reason=reason)
        raise ConsentDenied(f"party {gate.name}: {reason}")
    return call_next(req)


def sequence_cache(gate: Gate, req: Request, call_next: CallNext) -> bytes:
    """Data operations: refuse a replay or a gap; answer an exact retry of the last request from the cache; keep
    the answer of a new one."""
    msg = req.msg
    if msg.op not in DATA_OPS:
        return call_next(req)
    key = bytes(req.data)
    try:
        cached = gate.guard.check(req.caller, msg.session, msg.seq, key)
    except WireError as e:
        gate.audit.append(req.caller, msg.op, **req.rec, decision="deny", reason=str(e))
        raise
    if cached is not None:
        gate.audit.append(req.caller, msg.op, **req.rec, decision="retry", reason="answered from cache")
        return cached
    out = call_next(req)
    gate.guard.commit(req.caller, msg.session, msg.seq, key, out)
    return out


def consent(gate: Gate, req: Request, call_next: CallNext) -> bytes:
    """The party's consent policy decides this pass (from the operation it executes, never from a field the
    caller sends)."""
    msg = req.msg
    if msg.op == ANCHOR_OP and req.caller == gate.next_party:  # (no pass: the anchor exchange, admitted by role())
        return call_next(req)
    split, distinct, metric = request_fields(msg.op, msg.meta, msg.tensors)
    decision = gate.consent.check(PassRequest(gate.name, req.caller, msg.op, req.purpose, msg.session, msg.step,
                                              req.batch, split, distinct, metric))
    if not decision.allowed:
        gate.audit.append(req.caller, msg.op, **req.rec, decision="deny", reason=decision.reason)
        raise ConsentDenied(f"party {gate.name} refused {msg.op} (step {msg.step}): {decision.reason}")
    req.reason = decision.reason
    return call_next(req)


def audit(gate: Gate, req: Request, call_next: CallNext) -> bytes:
    """Run the dispatch (`call_next` gives the reply :class:`Message`) and record its outcome; encode the answer.

    A failure is recorded as an error (any other exception than a ModelwardError becomes a PartyError naming it).
    A data pass's record is written now (a crash of this process cannot lose it) and synced to stable storage in
    the background, off the step's critical path; every checkpoint and every answer to a control operation waits
    for it, so no saved state rests on a record a power cut could take away. The party's head (this record
    included) travels back along the chain with a data answer, and to the driver with a control answer."""
    msg, op, rec = req.msg, req.msg.op, req.rec
    try:
        reply: Message = call_next(req)
    except (ModelwardError, RuntimeError, ValueError) as e:
        reason = str(e) if isinstance(e, ModelwardError) else f"{type(e).__name__}: {e}"
        gate.audit.append(req.caller, op, **rec, decision="error", reason=reason + gate.handler.note)
        if isinstance(e, ModelwardError):
            raise
        raise PartyError(f"party {gate.name}: {op} failed: {reason}") from None
    down = reply.meta.pop("_anchors", {})
    if down:
        rec["anchors"] = {**rec["anchors"], **down}
    if op == ANCHOR_OP:  # the exchange records itself, and only when it anchors a decision not anchored yet
        reply.meta["audit_head"] = gate.audit.head_ref
        return encode(reply)
    gate.audit.append(req.caller, op, **rec, decision="allow",
                      reason=req.reason + gate.handler.note + wire_note(msg, reply), durable=op not in DATA_OPS)
    if op in DATA_OPS:
        reply.meta["anchors"] = {**down, gate.name: gate.audit.head_ref}
    else:
        reply.meta["audit_head"] = gate.audit.head_ref
    reply.session, reply.seq = msg.session, msg.seq
    return encode(reply)


CHECKS: tuple[Check, ...] = (peer_pin, decode_body, op_known, in_order, role, sequence_cache, consent, audit)


def dispatch(gate: Gate, req: Request) -> Message:
    """The innermost step: the handler's operation."""
    return gate.handler.dispatch(req.msg.op, req.msg, req.caller)


class Gate:
    """The admission path of one party (see the module docstring): :data:`CHECKS` folded around the dispatch.

    Args:
        handler: the party's operations (:class:`Handler`).
        name: the party's name; driver / prev: who may send control / data operations; next_party: the next
            party, admitted for the anchor exchange only.
        audit: the party's audit log; consent: its consent checker (policy and peer allow-list).
        lock: the party's state lock (held from :func:`in_order` to the end of the chain).
        max_message_bytes: the size limit of a request; refusals_every_s: at most one record per peer per this
            many seconds for refusals of undecoded, malformed or unknown requests.
        max_sessions_per_peer: sessions kept in the sequence cache per peer.
        revoked: ``revoked(caller) -> reason or None``: whether the caller's pinned certificate is revoked
            (:class:`~modelward.governance.trust.revocation.DenyList`); None: no deny-list.
        checks: the checks in order (default :data:`CHECKS`).

    Returns:
        ``handle(caller, data) -> bytes``; a refusal raises a ModelwardError subclass (the transport maps it to a
        status code).
    """

    def __init__(self, handler: Handler, *, name: str, driver: str, prev: str | None, audit: AuditLog,
                 consent: ConsentChecker, lock: threading.RLock, max_message_bytes: int = 64 * 2**20,
                 refusals_every_s: float = 10.0, max_sessions_per_peer: int = 8,
                 checks: tuple[Check, ...] = CHECKS, revoked: Callable[[str], str | None] | None = None,
                 next_party: str | None = None) -> None:
        self.handler, self.name, self.driver, self.prev = handler, name, driver, prev
        self.next_party = next_party
        self.audit, self.consent, self.lock = audit, consent, lock
        self.max_message_bytes, self.refusals_every_s = max_message_bytes, refusals_every_s
        self.revoked = revoked
        self.guard = SequenceGuard(max_sessions_per_peer,
                                   lambda caller, session: audit.last_seq(session, caller, DATA_OPS))
        self.order = InOrder()
        call: CallNext = functools.partial(dispatch, self)
        for check in reversed(checks):
            call = functools.partial(check, self, call_next=call)
        self._chain = call

    def handle(self, caller: str, data: bytes) -> bytes:
        """Admit (or refuse) one request from the pinned peer `caller`; returns the encoded answer."""
        return self._chain(Request(caller, data))

    def role_ok(self, caller: str, op: str) -> bool:
        """Who may ask for what is fixed by the chain: data operations from the previous party (the driver for
        the first), ``open`` and ``status`` from the driver or the previous party, the rest from the driver."""
        if op in DATA_OPS:
            return caller == (self.prev if self.prev is not None else self.driver)
        if op == ANCHOR_OP:  # both neighbours exchange heads (and where they listen: audit.Anchoring)
            return caller is not None and caller in (self.prev, self.next_party)
        if op in ("open", "status"):
            return caller in (self.driver, self.prev)
        return caller == self.driver

    def accepted(self, caller: str, session: str) -> int:
        """The last sequence number accepted from `caller` in `session`."""
        with self.lock:
            return self.guard.last_seq(caller, session)
