"""Append-only, hash-chained audit log in SQLite (issue 3 item 4).

Every record carries ``prev_hash`` (the previous record's hash) and ``hash = sha256(prev_hash ‖ canonical JSON of
its fields, including its id)``. Editing a record breaks its own hash; deleting, inserting or reordering records
breaks the chain.

Cross-anchoring (issue 10 item 7): after every step each party's head (record id + hash) travels with the step's
messages to the other parties of the chain, and each records the others' heads in the ``anchors`` field of its own
record. A party that later truncates or rewrites its tail no longer contains the record an anchor names, which
:func:`verify_against` (``modelward audit verify LOG --against OTHER_LOG``) reports. Every record also stores the
executed operation and the purpose the party derived from it.

Bounded coverage (issue 26 item 5): heads that only travel with steps leave every record after the last step
unanchored (refusals, fetches, malformed messages), and those could be deleted or rewritten unseen. So each party
also runs an **anchor exchange** with its neighbours (:class:`Anchoring`): it offers its head
(:meth:`AuditLog.anchor_offer`), the neighbour records it if it covers a decision it has not anchored yet and
answers with its own head (:meth:`AuditLog.anchor_accept`), which the party records the same way
(:meth:`AuditLog.anchor_settle`). The exchange writes nothing when neither side has a new decision, so idle parties
do not fill their logs; its own ``anchor`` records hold no decision of the party that writes them (deleting one
hides nothing the party did).

Across restarts and moves (issue 36 item 6): the exchange runs in both directions (the previous party dials the
next and the next the previous), at least every ``anchor_every_s`` and soon after every record whose head no
answer carries (a refusal, a failure: :meth:`AnchorLoop.poke`), and once more when a party stops cleanly. Each side
gives its own address in its offer and keeps the other's last *proven* address (an exchange at it succeeded, the
connection having checked the pin), so a party restarted on another port tells its neighbour where it is, and a
restarted party finds its neighbours where they were. What stays unanchored after a crash is what was written
since the last completed exchange: see :class:`Anchoring` and docs/governance.md ("Anchoring across restarts").
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelward.errors import IdentityError, ModelwardError

GENESIS = "0" * 64
ANCHOR_OP = "anchor"  # the records of the anchor exchange (no decision of the party writing them)
FIELDS = ("id", "ts", "party", "caller", "op", "purpose", "session", "step", "seq", "batch", "shapes", "decision",
          "reason", "anchors")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS audit (
  id INTEGER PRIMARY KEY, ts REAL NOT NULL, party TEXT NOT NULL, caller TEXT NOT NULL, op TEXT NOT NULL,
  purpose TEXT NOT NULL, session TEXT NOT NULL, step INTEGER NOT NULL, seq INTEGER NOT NULL, batch INTEGER NOT NULL,
  shapes TEXT NOT NULL, decision TEXT NOT NULL, reason TEXT NOT NULL, anchors TEXT NOT NULL,
  prev_hash TEXT NOT NULL, hash TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS audit_caller ON audit(caller, op, decision, session);
CREATE INDEX IF NOT EXISTS audit_ts ON audit(caller, ts, decision);
"""


class AuditError(ModelwardError):
    """The audit log cannot be opened or written."""


def record_hash(prev_hash: str, rec: dict[str, Any]) -> str:
    body = json.dumps([rec[f] for f in FIELDS], separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256((prev_hash + body).encode()).hexdigest()


class AuditLog:
    """Thread-safe appender. Every record is written to the log (SQLite WAL) before the response leaves the party,
    so a crashed or killed party process never loses one.

    Durability against a power cut (the WAL on stable storage, ``fsync``) is immediate by default
    (``append(..., durable=True)``). A party writes the records of its data passes (steps, evaluations,
    predictions) with ``durable=False``: a background thread syncs them while the step travels on, and
    :meth:`sync` — which the party calls before it saves a checkpoint and before it answers any control
    operation — waits for it. So no saved state rests on a record that a power cut could take away, and the fsync
    is off the step's critical path. (What a power cut *can* lose: the records of the last data passes, at most
    those since the last sync, together with the party's in-memory state; the heads other parties anchored for
    them then no longer match, and ``audit verify --against`` reports that tail, as it must.)

    Each record carries the hash of the previous one (a hash chain in SQLite), so :func:`verify` finds any edited,
    deleted, inserted or reordered record.

    Args:
        path: the SQLite file (created with its folder); an unreadable or older-format file raises ``AuditError``.
        party: this party's name, stored in every record.

    Returns:
        The log; ``append(caller, op, ...)`` returns the new record's hash, ``head_ref`` ``[id, hash]`` of the
        latest record, ``count(ops, ...)`` counts records (the consent counters), ``close()`` closes the file.

    Example:
        >>> import os, tempfile
        >>> log = AuditLog(os.path.join(tempfile.mkdtemp(), "audit.db"), party="alice")
        >>> h = log.append("bob", "step", session="s1", step=1, batch=32)
        >>> log.head_ref == [1, h]
        True
        >>> log.close()
    """

    def __init__(self, path: str | Path, party: str) -> None:
        self.path, self.party = Path(path), party
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            # WAL + NORMAL: a commit is written to the WAL (safe against a crash of the process) without an fsync;
            # we fsync the WAL ourselves (sync(), the background syncer), in order, since WAL frames are appended
            # in order a sync covers every earlier record. A record's head travels to the other parties, so a
            # record lost in a power cut would later look like a truncated tail (--against).
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(_SCHEMA)
            cols = [r[1] for r in self.db.execute("PRAGMA table_info(audit)")]
        except sqlite3.DatabaseError as e:
            raise AuditError(f"{self.path}: cannot open audit log ({e})") from None
        if "purpose" not in cols or "anchors" not in cols:
            raise AuditError(f"{self.path}: an audit log of an older modelward version (no purpose/anchors "
                             "columns); keep it for the record and give this party a new audit_db")
        self._refusals: dict[tuple[str, str], tuple[float, int]] = {}  # rate limit: (peer, kind) -> (last, n)
        # called with (op, decision) after every record that is not an anchor exchange's (the party pokes its
        # anchor exchange for the records no answer anchors: see Anchoring)
        self.on_record: Any = None
        self.lock = threading.Lock()
        row = self.db.execute("SELECT id, hash FROM audit ORDER BY id DESC LIMIT 1").fetchone()
        self.last_id, self.head = (row[0], row[1]) if row else (0, GENESIS)
        row = self.db.execute("SELECT MAX(id) FROM audit WHERE op != ?", (ANCHOR_OP,)).fetchone()
        self.decision_id = int(row[0] or 0)  # the latest record that is not an anchor exchange
        self.anchored: dict[str, int] = {}  # peer -> the highest of its record ids anchored in this log
        for (text,) in self.db.execute("SELECT anchors FROM audit WHERE anchors != '{}'"):
            self._note_anchors(text)
        self._wal_fd: int | None = None
        self._synced = -1  # records up to this id are on stable storage (-1: not known yet)
        self._wanted = self.last_id
        self._sync_error: OSError | None = None
        self._closing = False
        self._cv = threading.Condition()
        self._syncer = threading.Thread(target=self._sync_loop, name=f"audit-sync-{party}", daemon=True)
        self._syncer.start()
        self.sync()  # whatever an earlier run left in the WAL is durable from here on

    # ------------------------------------------------------------------ durability
    def _fsync_wal(self) -> None:
        if self._wal_fd is None:
            try:
                self._wal_fd = os.open(f"{self.path}-wal", os.O_RDONLY)
            except FileNotFoundError:  # nothing written through the WAL yet: the database file holds everything
                os.fsync(fd := os.open(self.path, os.O_RDONLY))
                os.close(fd)
                return
        os.fsync(self._wal_fd)

    def _sync_loop(self) -> None:
        while True:
            with self._cv:
                while self._wanted <= self._synced and not self._closing:
                    self._cv.wait()
                if self._closing and self._wanted <= self._synced:
                    return
                target = self._wanted
            try:
                self._fsync_wal()
            except OSError as e:
                with self._cv:
                    self._sync_error = e
                    self._cv.notify_all()
                return
            with self._cv:
                self._synced = max(self._synced, target)
                self._cv.notify_all()

    def sync(self) -> None:
        """Wait until every record appended so far is on stable storage (raises AuditError if that failed)."""
        with self._cv:
            target = self._wanted = max(self._wanted, self.last_id)
            self._cv.notify_all()
            while self._synced < target:
                if self._sync_error is not None or not self._syncer.is_alive():
                    raise AuditError(f"{self.path}: cannot sync the audit log to disk ({self._sync_error})")
                self._cv.wait(1.0)

    def append(self, caller: str, op: str, session: str = "", step: int = 0, seq: int = 0, batch: int = 0,
               shapes: dict[str, list[int]] | None = None, decision: str = "allow", reason: str = "", *,
               purpose: str | None = "", anchors: dict[str, list] | None = None, durable: bool = True) -> str:
        """Append one record; returns its hash. With ``durable=False`` the fsync happens in the background
        (the record is written already; :meth:`sync` waits for it)."""
        with self.lock:
            rec = {"id": self.last_id + 1, "ts": round(time.time(), 6), "party": self.party, "caller": caller,
                   "op": op, "purpose": purpose or "", "session": session, "step": int(step), "seq": int(seq),
                   "batch": int(batch), "shapes": json.dumps(shapes or {}, sort_keys=True, separators=(",", ":")),
                   "decision": decision, "reason": reason,
                   "anchors": json.dumps(anchors or {}, sort_keys=True, separators=(",", ":"))}
            h = record_hash(self.head, rec)
            self.db.execute(f"INSERT INTO audit ({','.join(FIELDS)}, prev_hash, hash) VALUES "
                            f"({','.join('?' * (len(FIELDS) + 2))})", [*(rec[f] for f in FIELDS), self.head, h])
            self.last_id, self.head = rec["id"], h
            if op != ANCHOR_OP:
                self.decision_id = rec["id"]
            if anchors:
                self._note_anchors(rec["anchors"])
        with self._cv:
            self._wanted = max(self._wanted, rec["id"])
            self._cv.notify_all()
        if durable:
            self.sync()
        if op != ANCHOR_OP and self.on_record is not None:
            self.on_record(op, decision)
        return h

    def _note_anchors(self, text: str) -> None:
        try:
            anchors = json.loads(text)
        except json.JSONDecodeError:
            return
        if not isinstance(anchors, dict):
            return
        for peer, ref in anchors.items():
            if isinstance(ref, list) and len(ref) == 2 and isinstance(ref[0], int):
                self.anchored[peer] = max(self.anchored.get(peer, 0), ref[0])

    # ------------------------------------------------------------------ anchor exchange
    def anchor_offer(self) -> dict[str, Any]:
        """What this party offers a neighbour to anchor: its head and its latest decision record's id."""
        with self.lock:
            return {"head": [self.last_id, self.head], "decision": self.decision_id}

    def _record_offer(self, peer: str, offer: Any) -> bool:
        head, decision = _valid_offer(offer)
        with self.lock:
            if decision <= self.anchored.get(peer, 0):
                return False  # nothing new of the peer's to anchor
        self.append(peer, ANCHOR_OP, decision="allow", reason=f"anchor exchange: {peer}'s head {head[0]}",
                    purpose=None, anchors={peer: head})
        return True

    def anchor_accept(self, peer: str, offer: Any) -> dict[str, Any]:
        """A neighbour's offer arrives: record its head if it covers a decision not anchored here yet; answer with
        this log's own offer (AuditError on a malformed offer)."""
        self._record_offer(peer, offer)
        return self.anchor_offer()

    def anchor_settle(self, peer: str, answer: Any) -> bool:
        """The neighbour's answer to our offer: record its head the same way. Returns whether a record was written."""
        return self._record_offer(peer, answer)

    def refusal(self, caller: str, op: str, reason: str, every_s: float, **kw: Any) -> bool:
        """Record a wire- or identity-level refusal, at most once per `every_s` seconds per (caller, op); the
        next record says how many were suppressed in between. Returns whether a record was written."""
        key = (caller, op)
        now = time.monotonic()
        last, skipped = self._refusals.get(key, (-1e18, 0))
        if now - last < every_s:
            self._refusals[key] = (last, skipped + 1)
            return False
        if len(self._refusals) > 4096:  # bounded: an attacker cycling through certificates cannot grow it
            self._refusals.clear()
        self._refusals[key] = (now, 0)
        extra = f" ({skipped} similar refusal(s) in the previous {every_s:g}s not recorded)" if skipped else ""
        self.append(caller, op, decision="deny", reason=reason + extra, **kw)
        return True

    @property
    def head_ref(self) -> list:
        """[record id, hash] of the latest record: what this party's peers anchor in their logs."""
        with self.lock:
            return [self.last_id, self.head]

    def count(self, ops: tuple[str, ...], session: str | None = None, since: float | None = None,
              decision: str = "allow", caller: str | None = None, min_batch: int = 0) -> int:
        """Records of `ops` with `decision` (by caller, session, since a time; `min_batch`: of at least that many
        rows — a pipelined drain, which carries no batch, is not a training step)."""
        q = f"SELECT COUNT(*) FROM audit WHERE decision = ? AND op IN ({','.join('?' * len(ops))})"
        args: list[Any] = [decision, *ops]
        if min_batch > 0:
            q += " AND batch >= ?"
            args.append(min_batch)
        if caller is not None:
            q += " AND caller = ?"
            args.append(caller)
        if session is not None:
            q += " AND session = ?"
            args.append(session)
        if since is not None:
            q += " AND ts >= ?"
            args.append(since)
        with self.lock:
            return int(self.db.execute(q, args).fetchone()[0])

    def rows(self, ops: tuple[str, ...], caller: str | None = None, since: float | None = None) -> int:
        """Rows (the ``batch`` of allowed records) of operations `ops` by `caller` since `since` (a UNIX time): the
        row budgets of :mod:`.flow_policy`, counted from the log, so neither a new session nor a restart resets
        them."""
        q = f"SELECT COALESCE(SUM(batch), 0) FROM audit WHERE decision = 'allow' AND op IN ({','.join('?' * len(ops))})"
        args: list[Any] = [*ops]
        if caller is not None:
            q += " AND caller = ?"
            args.append(caller)
        if since is not None:
            q += " AND ts >= ?"
            args.append(since)
        with self.lock:
            return int(self.db.execute(q, args).fetchone()[0])

    def last_seq(self, session: str, caller: str, ops: tuple[str, ...]) -> int:
        """The last sequence number `caller` used in `session` for a sequenced operation (restored after a restart;
        only operations that passed the sequence check are counted, so a bogus number never sticks)."""
        q = (f"SELECT MAX(seq) FROM audit WHERE session = ? AND caller = ? AND op IN ({','.join('?' * len(ops))}) "
             "AND decision = 'allow'")
        with self.lock:
            row = self.db.execute(q, (session, caller, *ops)).fetchone()
        return int(row[0] or 0)

    def close(self) -> None:
        if self._closing:
            return
        try:
            self.sync()
        finally:
            with self._cv:
                self._closing = True
                self._cv.notify_all()
            self._syncer.join(5.0)
            with self.lock:
                self.db.close()
            if self._wal_fd is not None:
                os.close(self._wal_fd)
                self._wal_fd = None


def _valid_offer(offer: Any) -> tuple[list, int]:
    """(head [id, hash], decision id) of an anchor offer, or AuditError (it comes from another party)."""
    if not isinstance(offer, dict):
        raise AuditError("anchor offer: expected {'head': [id, hash], 'decision': id}")
    head, decision = offer.get("head"), offer.get("decision")
    if not (isinstance(head, list) and len(head) == 2 and isinstance(head[0], int) and not isinstance(head[0], bool)
            and isinstance(head[1], str) and len(head[1]) == 64 and isinstance(decision, int)
            and not isinstance(decision, bool) and 0 <= decision <= head[0]):
        raise AuditError("anchor offer: expected {'head': [id, 64-hex hash], 'decision': id <= head id}")
    return [int(head[0]), str(head[1])], int(decision)


class AnchorLoop:
    """Runs ``exchange()`` every `every_s` seconds on a daemon thread until :meth:`close` (errors are reported to
    `on_error` and the loop goes on: a neighbour that is down is tried again next time). :meth:`poke` asks for an
    exchange soon (at most one every `min_gap_s`: a burst of records costs one exchange).

    Args:
        every_s: the bound on how long a decision record stays unanchored (plus one round trip).
        exchange: one anchor exchange with the neighbour(s).
        on_error: called with the exception of a failed exchange.
        min_gap_s: the least time between two exchanges asked for by :meth:`poke`.

    Example:
        >>> import threading
        >>> done = threading.Event()
        >>> loop = AnchorLoop(0.01, done.set)
        >>> done.wait(5)
        True
        >>> loop.close()
    """

    def __init__(self, every_s: float, exchange: Any, on_error: Any = None, name: str = "audit-anchor",
                 min_gap_s: float = 0.25) -> None:
        self.every_s, self.exchange, self.on_error, self.min_gap_s = every_s, exchange, on_error, min_gap_s
        self._stop = threading.Event()
        self._poked = threading.Event()
        self.failures = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def poke(self) -> None:
        """Run an exchange soon (a record was written whose head no answer carries: a refusal, a failure)."""
        self._poked.set()

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            poked = self._poked.wait(max(0.0, self.every_s - (time.monotonic() - last)))
            if self._stop.is_set():
                return
            if poked:  # coalesce a burst of pokes (and never more often than min_gap_s)
                wait = self.min_gap_s - (time.monotonic() - last)
                if wait > 0 and self._stop.wait(wait):
                    return
            elif time.monotonic() - last < self.every_s:
                continue
            self._poked.clear()
            last = time.monotonic()
            try:
                self.exchange()
            except Exception as e:  # noqa: BLE001 - a failed exchange is retried next period
                self.failures += 1
                if self.on_error is not None:
                    self.on_error(e)

    def close(self) -> None:
        self._stop.set()
        self._poked.set()
        self._thread.join(5.0)


MAX_ADDRESS = 255  # host:port, as a neighbour announces it


def announced_address(value: Any, known: str | None = None) -> str | None:
    """An address a neighbour gave for itself, checked: ``host:port`` (at most 255 characters, port 1..65535,
    no whitespace); an unspecified host (``0.0.0.0``, ``::``, empty: a server listening on every interface) takes
    the host of the address we know the neighbour by. None when unusable."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ADDRESS or any(c.isspace() for c in value):
        return None
    host, _, port = value.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        return None
    if host.strip("[]") in ("", "0.0.0.0", "::"):
        if not known:
            return None
        host = known.rpartition(":")[0]
    return f"{host}:{int(port)}" if host else None


class Anchoring:
    """The anchor exchanges of one party with its chain neighbours, and where those neighbours listen now.

    Every `every_s` seconds, and soon after any record that no answer anchors (:meth:`poke`), the party offers
    each neighbour it can reach its head and its own address; the neighbour records the head (when it covers a
    decision not anchored there yet) and answers with its own head and address (:meth:`accept`). Both directions
    run: the previous party dials the next and the next dials the previous, so whichever of the two restarts on
    another port (``port = 0``) tells the other where it is now, and records are anchored whichever side moved.

    **Who may say where a neighbour is** (a redirected neighbour would leave records unanchored): the party's own
    configuration, the driver when it opens a session (the control role; as before), and the neighbour itself —
    an address in an exchange is always *the caller's own*, bound to the identity its pinned certificate proved;
    nobody can announce an address for somebody else. And no address is used on anyone's word: a new one is taken
    only after an exchange at it succeeded, which the connection's pin check makes proof that the neighbour
    listens there; a working address is never given up for an announced one. The last proven address of each
    neighbour is kept in `store`, so a restarted party finds its neighbours again.

    On :meth:`close` (a clean stop) one last exchange anchors what the party wrote since the previous one.

    Args:
        log: the party's audit log.
        neighbours: ``{name: configured address or None}``: the previous and the next party.
        call: ``call(name, address, meta, timeout) -> answer meta``: one request over the party's own link (the
            connection checks the neighbour's pin).
        address: ``address() -> where this party listens`` (None until its server is up).
        every_s: the period of the exchange (``anchor_every_s``).
        store: the JSON file of the neighbours' last proven addresses (None: not kept).
        on_switch: ``on_switch(name, address)`` when a neighbour was found at a new, proven address.
        on_error: called with the exception of a failed round.

    Returns:
        The running exchange; :meth:`accept` answers a neighbour's offer, :meth:`told` takes the driver's word,
        :meth:`poke` asks for a round soon, :meth:`close` stops after a last one.

    Example:
        >>> anchoring = Anchoring(log, {"bob": "b.example.org:50062"}, call, lambda: "a.example.org:50061")
        ... # doctest: +SKIP
    """

    def __init__(self, log: AuditLog, neighbours: dict[str, str | None], call: Any, address: Any,
                 every_s: float = 10.0, store: str | Path | None = None, on_switch: Any = None,
                 on_error: Any = None, name: str = "anchor") -> None:
        self.log, self.call, self.address, self.on_switch = log, call, address, on_switch
        self.store = Path(store) if store is not None else None
        self.configured = dict(neighbours)
        self._lock = threading.Lock()
        proven = self._load()
        self.current: dict[str, str | None] = {n: proven.get(n) or a for n, a in neighbours.items()}
        self.proven: dict[str, str | None] = {n: proven.get(n) for n in neighbours}
        self.heard: dict[str, list[str]] = {n: [] for n in neighbours}
        self.timeout: float | None = None
        self.loop = AnchorLoop(every_s, self.run, on_error, name=name) if neighbours else None

    # ------------------------------------------------------------------ where the neighbours are
    def _load(self) -> dict[str, str]:
        if self.store is None or not self.store.is_file():
            return {}
        try:
            data = json.loads(self.store.read_text())
            return {str(k): str(v) for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}  # only a hint where to look first; every address is proven before use

    def _save(self) -> None:
        if self.store is None:
            return
        data = {n: a for n, a in self.proven.items() if a}
        self.store.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.store.with_name(f".{self.store.name}.tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.store)

    def told(self, name: str, address: str) -> None:
        """The driver (control role) says where `name` listens: tried first from now on (a session's own word)."""
        if name in self.current:
            with self._lock:
                self.current[name] = address

    def where(self, name: str) -> str | None:
        """Where `name` is dialled now."""
        with self._lock:
            return self.current.get(name)

    def _candidates(self, name: str) -> list[str]:
        with self._lock:
            order = [self.current.get(name), *reversed(self.heard[name]), self.proven.get(name),
                     self.configured.get(name)]
        return [a for a in dict.fromkeys(order) if a]

    # ------------------------------------------------------------------ the exchange
    def offer(self) -> dict[str, Any]:
        """What this party sends a neighbour: its head (and latest decision) and where it listens."""
        out: dict[str, Any] = {"offer": self.log.anchor_offer()}
        mine = self.address()
        if mine:
            out["address"] = mine
        return out

    def accept(self, caller: str, meta: dict[str, Any]) -> dict[str, Any]:
        """A neighbour's exchange arrives (the gate admitted it from the previous or the next party): its head is
        recorded when it covers a decision not anchored here yet; the address it gives is *its own* (the caller's
        pinned identity) and is tried once the one we know fails. Returns this party's answer."""
        self.log.anchor_accept(caller, meta.get("offer"))
        self._heard(caller, meta.get("address"))
        return self.offer()

    def _heard(self, name: str, value: Any) -> None:
        if name not in self.heard:
            return
        with self._lock:
            addr = announced_address(value, self.current.get(name) or self.proven.get(name))
            if addr is None or addr == self.current.get(name):
                return
            self.heard[name] = [a for a in self.heard[name] if a != addr][-3:] + [addr]
        self.poke()  # prove it soon (only used once the address we know fails)

    def exchange(self, name: str) -> str | None:
        """One exchange with `name`: at the address we dial it by; if that fails, at each other address we have
        for it (the ones it announced, newest first, its last proven one, the configured one). The first that
        answers is proven (the connection checked the pin) and becomes the current one. Returns it (None: no
        address known). Raises the last error when none answered."""
        last: Exception | None = None
        for addr in self._candidates(name):
            try:
                answer = self.call(name, addr, self.offer(), self.timeout)
            except Exception as e:  # noqa: BLE001 - try the next address; the last error is raised below
                last = e
                with self._lock:
                    announced = addr in self.heard[name]
                    if announced and isinstance(e, IdentityError):  # not the neighbour there: never tried again
                        self.heard[name].remove(addr)
                if announced and isinstance(e, IdentityError):
                    self.log.refusal(name, "(address)", f"{name} gave {addr} as its address; the server there is "
                                     f"not {name} ({e}); not used", 10.0)
                continue
            self.log.anchor_settle(name, answer.get("offer"))
            with self._lock:
                moved = self.current.get(name) != addr
                self.current[name] = addr
                self.heard[name] = [a for a in self.heard[name] if a != addr]
                changed = self.proven.get(name) != addr
                self.proven[name] = addr
            if changed:
                self._save()
            if moved and self.on_switch is not None:
                self.on_switch(name, addr)
            self._heard(name, answer.get("address"))
            return addr
        if last is not None:
            raise last
        return None

    def run(self) -> None:
        """One round: an exchange with every neighbour that has an address (errors raised after all tried)."""
        errors = []
        for name in self.configured:
            try:
                self.exchange(name)
            except Exception as e:  # noqa: BLE001 - collected; the loop reports them
                errors.append(e)
        if errors:
            raise errors[0]

    def on_record(self, op: str, decision: str) -> None:
        """The log's hook (``AuditLog.on_record``): a record whose head no answer carries (a refusal, a failure:
        the caller gets an error, not a head) is anchored by an exchange soon; an allowed request's head travels
        with its answer."""
        if decision != "allow":
            self.poke()

    def poke(self) -> None:
        """A round soon (a refusal or a failure was recorded: no answer carries its head)."""
        if self.loop is not None:
            self.loop.poke()

    def close(self, final_timeout: float = 5.0) -> None:
        """Stop the loop after one last round (each call bounded by `final_timeout`): what the party wrote since
        the previous round is anchored before it stops, wherever a neighbour answers."""
        if self.loop is None or self.timeout is not None:  # (none to run, or closed already)
            return
        self.loop.close()
        self.timeout = final_timeout
        try:
            self.run()
        except Exception:  # noqa: BLE001, S110 - a neighbour gone at shutdown: nothing more to do
            pass


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    records: int
    head: str
    bad_id: int | None = None
    problem: str = ""
    head_at: int | None = None  # the record whose hash is the published head, when one was given

    def __str__(self) -> str:
        if self.ok:
            extra = ""
            if self.head_at is not None:
                extra = f"; the published head is record {self.head_at}"
                if self.head_at < self.records:
                    extra += f", {self.records - self.head_at} record(s) appended after it"
            if self.problem:
                extra += f"; {self.problem}"
            return f"OK: {self.records} records, head {self.head[:16]}…{extra}"
        return f"TAMPERED: record {self.bad_id}: {self.problem}"


def verify(path: str | Path, expect_head: str | None = None) -> VerifyResult:
    """Walk the chain; report the first record that was edited, deleted, inserted or reordered.

    Args:
        path: the audit log (SQLite).
        expect_head: the published head hash (hex, ≥ 16 characters) the chain must contain.

    Returns:
        :class:`VerifyResult` (``ok``, record count, head, and where and why the chain breaks).

    Example:
        >>> log = AuditLog("bob-audit.sqlite", party="bob")  # doctest: +SKIP
        >>> log.append(caller="alice", op="forward", session="s1", step=1)  # doctest: +SKIP
        >>> verify("bob-audit.sqlite").ok  # doctest: +SKIP
        True
    """
    path = Path(path)
    rows = _rows(path)
    if expect_head is not None:
        expect_head = expect_head.strip().lower()
        if len(expect_head) < 16 or any(c not in "0123456789abcdef" for c in expect_head):
            raise AuditError(f"--head {expect_head!r}: expected the published head hash (hex, at least its "
                             "first 16 characters, as in summary.json's audit_heads)")
    prev, expected_id = GENESIS, 1
    head_at: int | None = None
    for row in rows:
        rec = dict(zip(FIELDS, row[: len(FIELDS)], strict=True))
        stored_prev, stored = row[-2], row[-1]
        rid = rec["id"]
        if rid != expected_id:
            return VerifyResult(False, len(rows), prev, rid, f"expected record id {expected_id}: "
                                f"record(s) {expected_id}..{rid - 1} were deleted" if rid > expected_id
                                else "record id out of sequence (inserted)")
        if stored_prev != prev:
            return VerifyResult(False, len(rows), prev, rid, "chain broken: the previous record was deleted, "
                                "inserted or reordered (prev_hash does not match)")
        if record_hash(prev, rec) != stored:
            return VerifyResult(False, len(rows), prev, rid, "edited: its content does not match its hash")
        prev, expected_id = stored, rid + 1
        if expect_head is not None and head_at is None and stored.startswith(expect_head):
            head_at = rid
    # The published head must be a record of the intact chain: records appended after it (a later session,
    # split predict) are legitimate; a truncation or a rewrite removes it.
    if expect_head is not None and head_at is None:
        return VerifyResult(False, len(rows), prev, expected_id - 1,
                            f"the published head {expect_head[:16]}… is not in the chain (head now "
                            f"{prev[:16]}…): records were removed from the end or the log was rewritten")
    return VerifyResult(True, len(rows), prev, head_at=head_at)


def _rows(path: Path) -> list[tuple]:
    if not path.is_file():
        raise AuditError(f"{path}: audit log not found")
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        rows = db.execute(f"SELECT {','.join(FIELDS)}, prev_hash, hash FROM audit ORDER BY id").fetchall()
        db.close()
    except sqlite3.DatabaseError as e:
        raise AuditError(f"{path}: not a modelward audit log ({e})") from None
    return rows


def head_of(path: str | Path) -> dict[str, Any]:
    """``modelward audit head LOG``: the party, the number of records and the head hash (no verification)."""
    rows = _rows(Path(path))
    if not rows:
        return {"party": None, "records": 0, "head": GENESIS}
    last = dict(zip(FIELDS, rows[-1][: len(FIELDS)], strict=True))
    return {"party": last["party"], "records": int(last["id"]), "head": rows[-1][-1]}


def anchors_in(path: str | Path, party: str) -> list[tuple[int, str, int]]:
    """The heads of `party` anchored in the log at `path`: (anchored record id, its hash, anchoring record id)."""
    out = []
    for row in _rows(Path(path)):
        rec = dict(zip(FIELDS, row[: len(FIELDS)], strict=True))
        try:
            anchors = json.loads(rec["anchors"] or "{}")
        except json.JSONDecodeError:
            continue
        ref = anchors.get(party)
        if isinstance(ref, list) and len(ref) == 2 and isinstance(ref[0], int) and isinstance(ref[1], str):
            out.append((ref[0], ref[1], int(rec["id"])))
    return out


def verify_against(path: str | Path, other: str | Path) -> VerifyResult:
    """Verify the log at `path` and check it against the heads of its party that another party anchored in its
    own log (`other`): every anchored record must still be in `path` with the same hash. A truncated tail (the
    anchored record is gone) or a rewritten one (different hash) is reported with the anchoring record."""
    path, other = Path(path), Path(other)
    own = verify(path)
    if not own.ok:
        return own
    theirs = verify(other)
    if not theirs.ok:
        raise AuditError(f"--against {other}: that log is itself not intact ({theirs}); it cannot vouch for {path}")
    rows = _rows(path)
    if not rows:
        return VerifyResult(False, 0, GENESIS, 0, "the log is empty")
    party = rows[0][FIELDS.index("party")]
    hashes = {int(r[0]): r[-1] for r in rows}
    refs = anchors_in(other, party)
    if not refs:
        return VerifyResult(True, len(rows), own.head, problem=f"(no heads of {party!r} are anchored in {other})")
    for rid, h, at in sorted(refs, key=lambda r: r[0]):
        if rid not in hashes:
            return VerifyResult(False, len(rows), own.head, rid,
                                f"missing: {other.name} record {at} anchors {party}'s record {rid} (hash {h[:16]}…), "
                                f"but this log ends at record {len(rows)}: its tail was truncated")
        if hashes[rid] != h:
            return VerifyResult(False, len(rows), own.head, rid,
                                f"rewritten: {other.name} record {at} anchors {party}'s record {rid} with hash "
                                f"{h[:16]}…, this log has {hashes[rid][:16]}… there")
    top = max(r[0] for r in refs)
    return VerifyResult(True, len(rows), own.head,
                        problem=f"checked against {len(refs)} head(s) anchored in {other}; the latest anchored "
                                f"record is {top} ({len(rows) - top} record(s) after it not anchored yet)")
