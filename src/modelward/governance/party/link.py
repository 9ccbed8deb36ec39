"""A party's link to the next party of the chain: the data link (sequenced per session) and the anchor exchange.

The link owns the client of the next party, the address it dials (from the party's configuration, or told by the
driver when the session opens), and the last sequence number used per session; a data operation continues along
the chain through :meth:`NextLink.call`, with the audit heads of the parties before it and this party's own. The
anchor exchanges with both neighbours (:class:`AnchorCalls`) have clients of their own, so that an exchange failing
while a neighbour restarts never leaves the data link's channel backing off.

Example:
    >>> link = NextLink("alice", "bob", "127.0.0.1:7001", connect, audit, max_sessions_per_peer=8)  # doctest: +SKIP
    >>> reply = link.call(msg, {"split": "test"}, {"h": h, "idx": idx}, codecs={})  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from modelward.errors import ModelwardError
from modelward.governance.audit import ANCHOR_OP, AuditLog
from modelward.governance.protocol import PartyClient, PartyError, PartyUnavailable, anchors_of
from modelward.governance.wire import Codec, Message, wire_note

Connect = Callable[[str, str], PartyClient]


class NextLink:
    """The link from party `name` to its next party `next_name`.

    Args:
        name / next_name: this party's and the next party's names (None: the last party, no link).
        address: where the next party listens (None: unknown until the driver says, see :meth:`tell_address`).
        connect: ``connect(name, address) -> PartyClient`` (the transport's: gRPC + mutual TLS, the next party
            pinned), or None (a party built without one refuses data operations that need the next party).
        audit: this party's audit log (its head travels with every request, and the anchor exchange records).
        max_sessions_per_peer: sessions kept; more than 4x this many forgotten at once (a new session re-opens).

    Attributes:
        seq: session -> the last sequence number used towards the next party (shared with the staleness window).
        client: the data link's client, once connected.
        note: what the last call adds to the request's audit record (what crossed compressed).
    """

    def __init__(self, name: str, next_name: str | None, address: str | None, connect: Connect | None,
                 audit: AuditLog, max_sessions_per_peer: int = 8) -> None:
        self.name, self.next_name, self.address = name, next_name, address
        self.connect, self.audit, self.max_sessions = connect, audit, max_sessions_per_peer
        self.client: PartyClient | None = None
        self.seq: dict[str, int] = {}

    @property
    def reachable(self) -> bool:
        """Whether the next party can be dialled (an address and a way to connect)."""
        return self.address is not None and self.connect is not None

    def tell_address(self, addr: str) -> None:
        """The driver says where the next party listens (the party's configuration left it open)."""
        if addr != self.address and self.client is not None:
            self.client.close()
            self.client = None
        self.address = addr

    def moved(self, addr: str) -> None:
        """The next party answered an anchor exchange at a new, proven address: the data link goes there too (its
        sessions re-open, as after a restart)."""
        if addr != self.address:
            self.address = addr
            self.reconnect()

    def reconnect(self) -> None:
        """Drop the data link: the next data operation connects again and re-opens its session (what a real restart
        of the next party leads to)."""
        if self.client is not None:
            self.client.close()
        self.client = None
        self.seq.clear()

    def open(self, session: str, evict: bool = True) -> PartyClient | None:
        """The data link, connected, with `session` open on it (its last sequence number, read from the next party,
        in :attr:`seq`).

        Args:
            session: the session the next request belongs to.
            evict: forget every session's number once more than 4 x max_sessions_per_peer are kept (the first
                party's staleness window passes False: its requests in flight hold numbers the next party may not
                have seen yet, and a session re-opened now would reuse them).

        Returns:
            The client; None where this party cannot reach its next party.
        """
        if not self.reachable:
            return None
        assert self.connect is not None and self.next_name is not None and self.address is not None
        if self.client is None:
            self.client = self.connect(self.next_name, self.address)
        if session not in self.seq:
            st = self.client.call(Message("open", session))
            if evict and len(self.seq) > 4 * self.max_sessions:
                self.seq.clear()
            self.seq[session] = int(st.meta["last_seq"])
        return self.client

    def call(self, msg: Message, meta: dict, tensors: dict[str, torch.Tensor],
             codecs: dict[str, Codec]) -> tuple[Message, str]:
        """The data operation `msg` continued to the next party (sequenced per session; the link re-opens after a
        failure). The heads of the parties before this one, and its own, travel with it.

        Returns:
            (the next party's answer, the note for this request's audit record: what crossed compressed).
        """
        op, session, step = msg.op, msg.session, msg.step
        if self.address is None:
            raise PartyError(f"party {self.name}: the address of the next party {self.next_name!r} is unknown "
                             f"(set [peers.{self.next_name}] address, or open the session through the driver)")
        if self.connect is None:
            raise PartyError(f"party {self.name}: built without a way to reach its next party {self.next_name!r} "
                             "(pass connect=, as the transport's server does)")
        try:
            client = self.open(session)
            assert client is not None
            seq = self.seq[session] + 1
            meta = {**meta, "anchors": {**anchors_of(msg, self.name), self.name: self.audit.head_ref}}
            sent = Message(op, session, step, seq, meta, tensors, codecs)
            out = client.call(sent)
            self.seq[session] = seq
            note = wire_note(out, sent).replace("received", f"{self.next_name} returned") \
                if codecs or out.received else ""
            return out, note
        except PartyUnavailable:
            self.seq.pop(session, None)
            raise

    def stats(self) -> dict | None:
        """Bytes on the data link (status), or None before it connected."""
        if self.client is None:
            return None
        s = self.client.stats
        return {"to": self.next_name, "sent": s.sent, "received": s.received, "raw": s.raw, "seconds": s.seconds,
                "calls": s.calls}

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


class AnchorCalls:
    """The anchor exchanges' links, one per neighbour (the call of :class:`~modelward.governance.audit.Anchoring`):
    a link of its own, so that an exchange failing while a neighbour restarts never leaves the data link's channel
    backing off (the next step would then fail fast instead of reconnecting).

    Args:
        connect: returns the party's current ``connect`` (tests swap it for a flaky link).

    Example:
        >>> calls = AnchorCalls(lambda: connect)  # doctest: +SKIP
        >>> calls("bob", "127.0.0.1:7001", {"offer": offer}, timeout=5.0)["offer"]  # doctest: +SKIP
    """

    def __init__(self, connect: Callable[[], Connect | None]) -> None:
        self.connect = connect
        self.clients: dict[str, tuple[str, PartyClient]] = {}

    def __call__(self, name: str, address: str, meta: dict, timeout: float | None) -> dict:
        """One exchange with neighbour `name` at `address`: its answer's meta (a failed link is dropped)."""
        held = self.clients.get(name)
        if held is None or held[0] != address:
            if held is not None:
                held[1].close()
            connect = self.connect()
            if connect is None:
                raise PartyError(f"no way to reach neighbour {name!r} (the party was built without connect=)")
            held = self.clients[name] = (address, connect(name, address))
        try:
            return held[1].call(Message(ANCHOR_OP, meta=meta), timeout=timeout).meta
        except ModelwardError:
            self.clients.pop(name)[1].close()
            raise

    def close(self) -> None:
        for _, client in self.clients.values():
            client.close()
        self.clients.clear()
