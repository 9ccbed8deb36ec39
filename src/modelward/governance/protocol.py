"""The party protocol without a transport: the operations, the error classes, the client interface.

Everything both ends of a link agree on lives here, below the party and the transports, so that neither the gRPC
client nor the in-process client needs the party, and the party needs no client (the client↔party circle of the
flat layout came from these definitions living in the gRPC module):

- :data:`DATA_OPS` (sequenced; from the previous party, the driver for the first) and :data:`CONTROL_OPS`
  (from the driver);
- the error classes a party raises and a client re-raises (a party re-raises its neighbour's error class, so the
  driver sees the cause);
- :class:`PartyClient`, the connection to one party, and :class:`Endpoint`, what an in-process client calls;
- :class:`LinkStats`, the bytes on one link;
- :func:`anchors_of`, the other parties' audit heads carried by a data message (cross-anchoring).

Example:
    >>> "step" in DATA_OPS and "commit" in CONTROL_OPS
    True
    >>> anchors_of(Message("step", meta={"anchors": {"bob": [3, "ab"], "me": [1, "x"]}}), own="me")
    {'bob': [3, 'ab']}
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Protocol

from modelward.errors import ModelwardError
from modelward.governance.wire import Message

DATA_OPS = ("step", "eval", "predict")  # sequenced; from the previous party (the driver for the first)
CONTROL_OPS = ("open", "status", "vote", "commit", "abort", "restore", "checkpoint", "fetch",  # from the driver
               "anchor")  # the audit anchor exchange (audit.ANCHOR_OP), from the previous or the next party
OPS = DATA_OPS + CONTROL_OPS
TENSOR_KEYS = ("h", "g", "x", "logits")  # the payload tensors counted as "raw" bytes on a link


class PartyError(ModelwardError):
    """A request cannot be served in the party's current state (wrong step, nothing prepared, ...)."""


class ConsentDenied(ModelwardError):
    """The party's consent policy (or its role table) refused the operation."""


class NumericError(PartyError):
    """An incoming tensor is out of bounds, or an update left non-finite/exploding parameters (rolled back)."""


class StepRolledBack(NumericError):
    """A prepared step failed a party's late check (its update is checked after its input gradient went back):
    that party rolled it back, so no party may commit it; the driver aborts it everywhere."""


class PartyUnavailable(ModelwardError):
    """A party cannot be reached (not started, crashed, or the connection broke)."""


_STATS_LOCK = threading.Lock()


@dataclass
class LinkStats:
    """Bytes on one link: sent, received, and the raw bytes of the payload tensors (h, g, x, logits) in them."""

    sent: int = 0
    received: int = 0
    raw: int = 0
    seconds: float = 0.0
    calls: int = 0

    def add(self, sent: int, received: int, raw: int, seconds: float, calls: int = 1) -> None:
        """Count a call (calls=0: a failed one); the driver may have two in flight on one link (a step sent
        ahead of the previous one's answer)."""
        with _STATS_LOCK:
            self.sent += sent
            self.received += received
            self.raw += raw
            self.seconds += seconds
            self.calls += calls


def raw_bytes(msg: Message) -> int:
    """The bytes of the payload tensors (:data:`TENSOR_KEYS`) in `msg`, as they are in memory."""
    return sum(t.numel() * t.element_size() for k, t in msg.tensors.items() if k in TENSOR_KEYS)


class PartyClient(Protocol):
    """A connection to one party. ``call`` sends a message and returns the decoded reply or raises the party's
    error class (ConsentDenied, PartyError, NumericError, WireError, IdentityError, PartyUnavailable)."""

    name: str
    stats: LinkStats

    def call(self, msg: Message, timeout: float | None = None) -> Message: ...

    def close(self) -> None: ...


class Endpoint(Protocol):
    """What serves a party's requests: ``handle(caller, bytes) -> bytes``, `caller` being the pinned peer name the
    transport identified. A :class:`~modelward.governance.party.machine.Party` is one."""

    @property
    def name(self) -> str: ...

    def handle(self, caller: str, data: bytes) -> bytes: ...


def anchors_of(msg: Message, own: str) -> dict[str, list]:
    """The other parties' audit heads carried by a data message (``meta.anchors``: {party: [record id, hash]}),
    validated and bounded; `own`'s entry is dropped (a party's own head comes from its own log).

    Args:
        msg: a decoded message.
        own: the name of the party reading it.

    Returns:
        ``{party: [record id, hash]}`` (empty when absent or malformed).
    """
    a = msg.meta.get("anchors")
    if not isinstance(a, dict) or len(a) > 64:
        return {}
    return {str(k)[:32]: [int(v[0]), str(v[1])[:64]] for k, v in a.items()
            if k != own and isinstance(v, list) and len(v) == 2 and isinstance(v[0], int)
            and not isinstance(v[0], bool) and isinstance(v[1], str)}
