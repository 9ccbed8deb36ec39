"""The coordinator of a split: the two-phase commit over the parties (seed 000 §1, steps 1–5).

The driver is the coordinator, not a relay: it sends batch *indices* to the first party, which starts the step
along the chain peer to peer (see :mod:`modelward.governance.party.machine`), and gets back only its answer. After
every party prepared step s it sends ``commit(s)`` to all of them; after a refusal or a failure anywhere,
``abort(s)`` (two-phase commit: no party applies a step that another one refused). Evaluations return metric sums,
predictions are fetched from the label holder. The driver never receives an activation or a gradient.

Crash safety: when a party disappears mid-step, the driver waits for it to come back, aborts what is prepared and
restores *every* party to the latest checkpoint step they all hold (:meth:`Coordinator.resume_point`); the
training loop (:mod:`.training`) rewinds the seeded batch order to that step and continues: no step is lost or
applied twice.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

import torch

from modelward.core.threads import torch_thread_pool
from modelward.errors import ConfigError, ModelwardError
from modelward.governance.driver import queries
from modelward.governance.driver.chain import check_chain, resume_target
from modelward.governance.driver.config import SplitConfig
from modelward.governance.driver.connect import Connect, grpc_connect
from modelward.governance.protocol import (
    LinkStats,
    PartyClient,
    PartyError,
    PartyUnavailable,
    StepRolledBack,
)
from modelward.governance.transport.client import InProcessClient
from modelward.governance.wire import Message


class Coordinator:
    """Coordinates the parties of one split (control to every party, batch indices to the first).

    Args:
        cfg: the split configuration.
        session: the session id (default: cfg.session or a fresh one).
        connect: ``connect(ref, cfg) -> PartyClient`` (default gRPC + mTLS; tests pass in-process clients).
        pipeline: in :meth:`train`, send step s+1 before step s is answered (default: when the first party is
            reached over the network, not when it runs in this process).
        staleness: 0 (exact steps) or k = 1..2: bounded-staleness pipelining on the first party's link (default:
            ``cfg.staleness``; see :meth:`SplitDriver.train`).
    """

    def __init__(self, cfg: SplitConfig, session: str | None = None, connect: Connect | None = None,
                 pipeline: bool | None = None, staleness: int | None = None) -> None:
        self.cfg = cfg
        self._pool: ThreadPoolExecutor | None = None  # rounds sent to every party at once
        self._sender_pool: ThreadPoolExecutor | None = None  # steps sent ahead (train)
        self.names = [p.name for p in cfg.parties]
        self.session = session or cfg.session or uuid.uuid4().hex
        self.clients: dict[str, PartyClient] = {}
        try:
            for p in cfg.parties:
                self.clients[p.name] = (connect or grpc_connect)(p, cfg)
        except BaseException:
            self.close()
            raise
        self.seq = 0  # data operations go to the first party only; the last one answered
        self._sent_seq = 0  # the last one sent (a step may be sent ahead of the previous one's answer)
        self._seq_lock = threading.Lock()
        # send step s+1 before step s is answered (train()): by default when the first party is across the network
        # (its round trip then overlaps the step before; a party hosted in this process answers at once anyway)
        self.pipeline = pipeline
        self.staleness = cfg.staleness if staleness is None else staleness
        if not isinstance(self.staleness, int) or not 0 <= self.staleness <= 2:
            self.close()
            raise ConfigError(f"staleness {self.staleness!r}: valid choices: 0 (exact), 1, 2")
        self.status: dict[str, dict[str, Any]] = {}
        self.received: list[tuple[str, str, list[str]]] = []  # (party, op, tensor names) of replies with tensors
        self.heads: dict[str, list] = {}  # the latest audit head each party reported
        self.uncommitted: int | None = None  # a step prepared everywhere whose commit has not been sent
        # what the label holder released with the last evaluation: the training loss of the steps committed since
        # its previous answer ({"mean", "steps", "rows"}), and why anything was withheld
        self.train_loss: dict[str, Any] | None = None
        self.withheld: str | None = None

    @property
    def links(self) -> dict[str, LinkStats]:
        return {n: c.stats for n, c in self.clients.items()}

    def close(self) -> None:
        for pool in (self._pool, self._sender_pool):
            if pool is not None:
                pool.shutdown()
        for c in self.clients.values():
            c.close()

    def __enter__(self) -> Coordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ transport
    def call(self, party: str, op: str, step: int = 0, meta: dict | None = None,
             tensors: dict[str, torch.Tensor] | None = None, timeout: float | None = None,
             seq: int | None = None) -> Message:
        """Send one operation to `party` and return its answer (raises the party's error class). Data operations
        (step, eval, predict) go to the first party and are numbered: the next number, or `seq` (taken by
        :meth:`_send_step`, in order, for a step sent ahead)."""
        sequenced = op in ("step", "eval", "predict")
        if sequenced and party != self.names[0]:
            raise PartyError(f"data operations go to the first party ({self.names[0]}), not {party}")
        numbered_here = sequenced and seq is None
        if not sequenced:
            seq = 0
        elif seq is None:
            with self._seq_lock:
                seq = self._sent_seq = max(self.seq, self._sent_seq) + 1
        try:
            out = self.clients[party].call(Message(op, self.session, step, seq, meta or {}, tensors or {}),
                                           timeout or self.cfg.timeout_s)
        except ModelwardError:
            if numbered_here:  # the party did not take this number: the next request reuses it
                with self._seq_lock:
                    self._sent_seq = self.seq
            # (a step numbered by _send_step / _send_stale is not rewound here, on its sender thread: the driver may
            # have numbered the step after it meanwhile, or be about to, and a later step would then be accepted
            # under the number of the refused one; _finish_step and settle_pipeline rewind once every request in
            # flight is in)
            raise
        if out.tensors:  # (only prediction logits, fetched from the label holder, ever arrive here)
            self.received.append((party, op, sorted(out.tensors)))
        with self._seq_lock:  # answers to two steps in flight may be processed at once: keep the newest head
            for n, ref in (out.meta.get("anchors") or {}).items():
                if n not in self.heads or ref[0] >= self.heads[n][0]:
                    self.heads[n] = ref
            if not sequenced and "audit_head" in out.meta:
                self.heads[party] = out.meta["audit_head"]
            if sequenced:
                self.seq = max(self.seq, seq)
        return out

    def open(self, train: bool) -> dict[str, dict[str, Any]]:
        """Open (or rejoin) the session on every party, tell each where its next neighbour listens, and check
        that they form the expected chain."""
        meta = {"train_cfg": self.cfg.train.model_dump(mode="json")} if train else {}
        metas = [{**meta, "next_address": self.cfg.parties[i + 1].resolved_address()} if i + 1 < len(self.names)
                 else meta for i in range(len(self.names))]
        # all parties at once (each answers after its audit sync and warm-up); the first error in chain order is
        # raised once every answer is in
        futures = [self._pooled().submit(self.call, n, "open", 0, m) for n, m in zip(self.names, metas, strict=True)]
        errors = [f.exception() for f in futures]
        for e in errors:
            if e is not None:
                raise e
        for i, (n, f) in enumerate(zip(self.names, futures, strict=True)):
            st = f.result().meta
            if st.get("party") != n:
                raise PartyError(f"party at {n}'s address says it is {st.get('party')!r}, expected {n!r}")
            self.status[n] = st
            self.heads[n] = st["audit_head"]
            if i == 0:
                self.seq = int(st["last_seq"])
        check_chain(self.status, self.names)
        return self.status

    # ------------------------------------------------------------------ passes
    def train_step(self, step: int, idx: torch.Tensor, lazy: bool = False) -> None:
        """One protocol step for all parties (phase 1 along the chain, then commit everywhere). On any error every
        party aborts step `step` (bit-identical state) and the error is raised. Nothing of the step comes back:
        its loss leaves the label holder only summed over committed steps, with the next evaluation.

        With `lazy`, the commit of this step travels with the next step's request (one round trip less per step;
        :meth:`flush` sends it explicitly)."""
        self._finish_step(step, self._send_step(step, idx, self.uncommitted, ahead=False), None)
        if not lazy:
            self.flush()

    def _pipelined(self) -> bool:
        if self.pipeline is not None:
            return self.pipeline
        return not isinstance(self.clients[self.names[0]], InProcessClient)

    def _send_step(self, step: int, idx: torch.Tensor, commit: int | None, ahead: bool) -> Future:
        """Send step `step` (carrying the commit of step `commit`), numbered now, in order. `ahead`: on a helper
        thread, so that the next step can be sent before this one is answered; otherwise right here."""
        with self._seq_lock:
            seq = self._sent_seq = max(self.seq, self._sent_seq) + 1
        meta = {} if commit is None else {"commit": commit}
        args = (self.names[0], "step", step, meta, {"idx": idx}, None, seq)
        if ahead:
            if self._sender_pool is None:
                self._sender_pool = torch_thread_pool(2, "driver-send")
            return self._sender_pool.submit(self._chain_call, *args)
        done: Future = Future()
        try:
            done.set_result(self._chain_call(*args))
        except ModelwardError as e:
            done.set_exception(e)
        return done

    def _chain_call(self, *args: Any) -> Message:
        """A step sent along the chain: every party of it is first checked against the driver's deny-list (a
        party the driver revoked is refused within one step even though only the first party is called)."""
        for c in self.clients.values():
            check = getattr(c, "check_peer", None)
            if check is not None:
                check()
        return self.call(*args)

    def _send_stale(self, step: int, idx: torch.Tensor | None, commit: int | None) -> Future:
        """A pipelined step (bounded staleness) on a sender thread, numbered now: batch `idx` of step `step`, or,
        with `idx` None, a drain (the first party finishes every step in flight). The answer lists the steps
        finished (``meta.done``)."""
        with self._seq_lock:
            seq = self._sent_seq = max(self.seq, self._sent_seq) + 1
        meta: dict[str, Any] = {"stale": self.staleness}
        if idx is None:
            meta["drain"] = True
        elif commit is not None:
            meta["commit"] = commit
        if self._sender_pool is None:
            self._sender_pool = torch_thread_pool(2, "driver-send")
        return self._sender_pool.submit(self._chain_call, self.names[0], "step", step, meta,
                                        {} if idx is None else {"idx": idx}, None, seq)

    def settle_pipeline(self, pending: list[Future], step: int) -> int:
        """After a pipelined (bounded-staleness) request failed: wait for the other requests in flight, settle the
        last finished step (committed everywhere, or aborted everywhere if a party's check refused it) and abort
        every later step on every party, in chain order (the first party first waits for its own requests to the
        next party: none arrives after the abort). Returns the step to continue from; raises StepRolledBack when a
        party refused the last finished step."""
        for f in pending:
            try:
                f.result()
            except ModelwardError:
                pass
        with self._seq_lock:
            self._sent_seq = self.seq
        late: StepRolledBack | None = None
        try:
            self.flush()
        except StepRolledBack as r:
            late, step = r, step - 1
        except ModelwardError:
            pass
        self.abort_all(step)
        if late is not None:
            raise late
        return step

    def _finish_step(self, step: int, sent: Future, ahead: tuple[int, Future] | None) -> None:
        """Wait for the answer to step `step` (prepared everywhere). On an error, the step sent after it (`ahead`, if any) is waited
        for, every party settles the step before (committed, or aborted with StepRolledBack if a party's late
        check refused it) and aborts this one (and the one ahead, should it have gone through), then the error is
        raised."""
        try:
            sent.result()
        except ModelwardError as e:
            if ahead is not None:
                # refused by the first party once this one failed (an out-of-order number), unless this answer was
                # lost on the way after the parties had run it: then the step ahead may have gone through
                try:
                    ahead[1].result()
                    self.abort_all(ahead[0])
                except ModelwardError:
                    pass
            with self._seq_lock:
                self._sent_seq = self.seq
            late: ModelwardError | None = None
            try:
                # the previous step: committed where every party's (late) check passed, aborted everywhere if one
                # failed (a party that is gone restores from its checkpoints anyway)
                self.flush()
            except StepRolledBack as r:
                late = r
            except ModelwardError:
                pass
            self.abort_all(step)
            if late is not None and not isinstance(e, StepRolledBack):
                raise late from e
            raise
        self.uncommitted = step

    def flush(self) -> None:
        """Commit the last prepared step on every party (idempotent where it is committed already), after every
        party voted for it: a party checks its update after sending its input gradient back, so its vote can
        come after the step's answer. A step that a party rolled back is aborted everywhere (StepRolledBack)."""
        if self.uncommitted is not None:
            step, self.uncommitted = self.uncommitted, None
            try:
                self._all("vote", step)
            except StepRolledBack:
                self.abort_all(step)
                raise
            self._all("commit", step)

    def _all(self, op: str, step: int) -> None:
        """Send a control operation to every party at once (they are independent; errors are raised after all
        replies are in)."""
        futures = [self._pooled().submit(self.call, n, op, step) for n in self.names]
        errors = [f.exception() for f in futures]
        for e in errors:
            if e is not None:
                raise e

    def _pooled(self) -> ThreadPoolExecutor:
        """The driver's small pool for rounds sent to every party at once."""
        if self._pool is None:
            self._pool = torch_thread_pool(min(8, len(self.names)), "driver")
        return self._pool

    def abort_all(self, step: int) -> None:
        """Best effort: a party that cannot be reached aborts by itself (it never committed)."""
        for n in self.names:
            try:
                self.call(n, "abort", step)
            except ModelwardError:
                pass

    def evaluate(self, metric: str = "error", batch_size: int = 1024) -> float:
        """Test loss like core.train.evaluate, computed along the chain: :func:`.queries.evaluate` (NaN when the
        label holder withheld its answer; its training-loss window in :attr:`train_loss`)."""
        return queries.evaluate(self, metric, batch_size)

    def predict(self, split: str = "test", x: torch.Tensor | None = None, batch_size: int = 256) -> torch.Tensor:
        """Predictions for the data owner's `split` (or for inputs `x`): :func:`.queries.predict`."""
        return queries.predict(self, split, x, batch_size)

    # ------------------------------------------------------------------ recovery
    def wait_all(self, deadline: float, train: bool, first_wait: float = 0.25, max_wait: float = 5.0) -> None:
        """(Re)open the session on every party, retrying with exponential backoff (`first_wait` doubling up to
        `max_wait` seconds) while one is unavailable, until `deadline` (``time.monotonic()``).

        Raises:
            PartyUnavailable: naming the party and its address (the transport's message) and how long the driver
                retried (``retry_s``), once the deadline has passed.
        """
        wait, t0 = first_wait, time.monotonic()
        while True:
            try:
                self.open(train)
                return
            except PartyUnavailable as e:
                now = time.monotonic()
                if now >= deadline:
                    if now - t0 < first_wait:  # (no retry asked for: retry_s = 0)
                        raise
                    raise PartyUnavailable(f"{e} (still unavailable after retrying for {now - t0:.0f} s: "
                                           f"retry_s in the split config)") from e
                time.sleep(min(wait, max(0.0, deadline - now)))
                wait = min(max_wait, wait * 2)

    def resume_point(self) -> int:
        """Continue where all parties are, if they agree and none is mid-step; otherwise restore every party to
        the latest checkpoint step they all hold (:func:`.chain.resume_target`)."""
        prepared, target = resume_target(self.status)
        for p in prepared:
            self.abort_all(p)
        if target is None:
            return int(next(iter(self.status.values()))["step"])
        for n in self.names:
            self.call(n, "restore", target, {"to_step": target})
        return target

    # ------------------------------------------------------------------ status

    def _status_all(self) -> dict[str, dict[str, Any]]:
        """Every party's status, asked of all at once (a party that cannot answer is left out)."""
        futures = {n: self._pooled().submit(self.call, n, "status") for n in self.names}
        return {n: f.result().meta for n, f in futures.items() if f.exception() is None}

    def link_summary(self, statuses: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, float]]:
        """Bytes per link: the driver's links (indices, losses) and each party's link to its next neighbour
        (activations and gradients), as the parties report them (in `statuses`, or asked now)."""
        out: dict[str, dict[str, float]] = {f"driver<->{n}": asdict(s) for n, s in self.links.items()}
        statuses = self._status_all() if statuses is None else statuses
        for n in self.names[:-1]:
            link = dict(statuses.get(n, {}).get("link") or {})
            if link:
                out[f"{n}<->{link.pop('to')}"] = link
        return out

    def checkpoint_all(self, export: bool = False) -> dict[str, dict[str, Any]]:
        self.flush()
        return {n: self.call(n, "checkpoint", 0, {"export": export}).meta for n in self.names}
