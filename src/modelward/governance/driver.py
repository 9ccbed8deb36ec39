"""Driver: split training and inference over running party servers (seed 000 §1, steps 1–5).

The driver is the coordinator, not a relay: it sends batch *indices* to the first party, which starts the step
along the chain peer to peer (see :mod:`modelward.governance.party`), and gets back only the loss. After every
party prepared step s it sends ``commit(s)`` to all of them; after a refusal or a failure anywhere, ``abort(s)``
(two-phase commit: no party applies a step that another one refused). Evaluations return metric sums, predictions
are fetched from the label holder. The driver never receives an activation or a gradient. Data order,
learning-rate schedule and optimizer are exactly those of :func:`modelward.core.train.train`, so split training
reproduces monolithic training when the parties start from the same parameters.

Crash safety: when a party disappears mid-step, the driver waits for it to come back, aborts what is prepared,
restores *every* party to the latest checkpoint step they all hold, rewinds the seeded batch order to that step
and continues: no step is lost or applied twice.
"""

from __future__ import annotations

import csv
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from pydantic import Field, model_validator

from modelward.core.config import StrictModel, dump_config, load_config
from modelward.core.records import write_csv
from modelward.core.train import TrainConfig, batch_order
from modelward.errors import ConfigError, ModelwardError
from modelward.governance.certs import check_name
from modelward.governance.client import (  # noqa: F401 - re-exported
    ConsentDenied,
    GrpcPartyClient,
    LinkStats,
    NumericError,
    PartyClient,
    PartyError,
    PartyUnavailable,
    StepRolledBack,
)
from modelward.governance.config import TLSConfig, _resolve
from modelward.governance.wire import Message, WireError  # noqa: F401 - re-exported

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

    from modelward.governance.party import Party


class PartyRef(StrictModel):
    name: str
    address: str | None = None  # host:port
    address_file: str | None = None  # or the file the party writes its address to (port 0, same host)
    fingerprint: str | None = None  # pin the party's certificate ("sha256:…"), or
    cert: str | None = None  # its certificate file (pinned by fingerprint)

    @model_validator(mode="after")
    def _one(self) -> PartyRef:
        if (self.address is None) == (self.address_file is None):
            raise ValueError(f"party {self.name}: give exactly one of address (host:port) or address_file")
        if self.fingerprint is not None and self.cert is not None:
            raise ValueError(f"party {self.name}: give fingerprint or cert, not both")
        return self

    def resolved_address(self) -> str:
        if self.address is not None:
            return self.address
        p = Path(self.address_file)
        if not p.is_file():
            raise ConfigError(f"party {self.name}: address_file {p} does not exist; start the party first "
                              f"(`modelward party serve …` writes it when it listens)")
        return p.read_text().strip()

    def pin(self) -> str | None:
        if self.cert is not None:
            from modelward.governance.certs import read_pem
            from modelward.governance.identity import cert_fingerprint

            return cert_fingerprint(read_pem(self.cert, f"parties.{self.name}.cert"))
        return self.fingerprint


class SplitConfig(StrictModel):
    """``SPLIT.toml``: the parties in chain order, the driver's identity, and the training procedure.

    Args:
        parties: at least 2 distinct parties in chain order (``name`` with ``address`` or ``address_file``,
            optionally a pinned ``fingerprint`` or ``cert``).
        tls: the driver's CA, client certificate and key (the identity the parties know as their ``driver``).
        train: the training procedure; seed: the data order.
        out_dir: where curves, steps and the session id go; session: the session id (default: a fresh one kept
            in ``out_dir/session.json`` so reruns resume).
        timeout_s: per request; retry_s: how long to wait for a crashed party; max_message_mb: message size limit.

    Returns:
        A strict config for :func:`run_training`.

    Example:
        >>> cfg = SplitConfig(parties=[{"name": "alice", "address": "127.0.0.1:5001"},
        ...                            {"name": "bob", "address": "127.0.0.1:5002"}],
        ...                   tls={"ca": "ca.pem", "cert": "driver.pem", "key": "driver.key"})
        >>> [p.name for p in cfg.parties], cfg.timeout_s
        (['alice', 'bob'], 60.0)
    """

    parties: list[PartyRef]
    tls: TLSConfig  # the driver's client certificate (the identity the parties know as their `driver`)
    train: TrainConfig = Field(default_factory=TrainConfig)
    seed: int = 0  # data order (batch_order), as in core.train.train(seed=...)
    out_dir: str = "runs/split"
    session: str | None = None  # default: a fresh id, kept in out_dir/session.json so reruns resume
    timeout_s: float = Field(60.0, gt=0)  # per request
    retry_s: float = Field(120.0, ge=0)  # how long to wait for a crashed party to come back
    max_message_mb: float = Field(64.0, gt=0)

    @model_validator(mode="after")
    def _chain(self) -> SplitConfig:
        if len(self.parties) < 2:
            raise ValueError("parties: a split needs at least 2 parties ([[parties]] name/address, in chain order)")
        names = [check_name(p.name) for p in self.parties]
        if len(set(names)) != len(names):
            raise ValueError(f"parties: names must be distinct, got {names}")
        return self


def load_split_config(path: str | Path, overrides: list[str] | None = None) -> SplitConfig:
    """Read a ``modelward split train`` file (TOML) with ``--set`` style `overrides`; TLS paths are resolved
    relative to the file.

    Args:
        path: the TOML file.
        overrides: ``key=value`` strings applied before validation.

    Returns:
        The validated :class:`SplitConfig`; a bad field raises ConfigError naming it.

    Example:
        >>> cfg = load_split_config("split.toml", ["train.steps=50"])  # doctest: +SKIP
    """
    cfg = load_config(path, SplitConfig, overrides)
    base = Path(path).resolve().parent
    cfg.tls = TLSConfig(ca=_resolve(base, cfg.tls.ca), cert=_resolve(base, cfg.tls.cert),
                        key=_resolve(base, cfg.tls.key))
    cfg.out_dir = _resolve(base, cfg.out_dir)
    for p in cfg.parties:
        p.address_file = _resolve(base, p.address_file)
        p.cert = _resolve(base, p.cert)
    return cfg


@dataclass
class SplitTrainResult:
    curve: list[tuple[int, float]]
    steps_run: int
    seconds: float
    links: dict[str, dict[str, float]]
    resumes: int
    audit_heads: dict[str, list]
    train_loss: list[tuple[int, float]] = field(default_factory=list)


Connect = Callable[[PartyRef, SplitConfig], PartyClient]


def grpc_connect(ref: PartyRef, cfg: SplitConfig) -> PartyClient:
    return GrpcPartyClient(ref.name, ref.resolved_address(), cfg.tls, ref.pin(), cfg.max_message_mb, cfg.timeout_s)


def hosted_connect(host: Party, cfg: SplitConfig) -> Connect:
    """Reach `host` — a party running inside the driver's process (:func:`governance.server.hosted_party`) —
    directly, as its configured driver, and every other party over gRPC with mutual TLS.

    Args:
        host: the hosted party (normally the first one, run by the organisation that drives the training).
        cfg: the split configuration; it must list the hosted party.

    Returns:
        A ``connect(ref, cfg)`` for :class:`SplitDriver`.

    Example:
        >>> drv = SplitDriver(cfg, connect=hosted_connect(alice, cfg))  # doctest: +SKIP
    """
    from modelward.governance.client import InProcessClient

    names = [p.name for p in cfg.parties]
    if host.cfg.name not in names:
        raise ConfigError(f"--host: party {host.cfg.name!r} is not one of this split's parties {names}")

    def connect(ref: PartyRef, c: SplitConfig) -> PartyClient:
        if ref.name == host.cfg.name:
            return InProcessClient(host, caller=host.cfg.driver)
        return grpc_connect(ref, c)

    return connect


class SplitDriver:
    """Coordinates the parties of one split (control to every party, batch indices to the first).

    Args:
        cfg: the split configuration.
        session: the session id (default: cfg.session or a fresh one).
        connect: ``connect(ref, cfg) -> PartyClient`` (default gRPC + mTLS; tests pass in-process clients).
        pipeline: in :meth:`train`, send step s+1 before step s is answered (default: when the first party is
            reached over the network, not when it runs in this process).
    """

    def __init__(self, cfg: SplitConfig, session: str | None = None, connect: Connect | None = None,
                 pipeline: bool | None = None) -> None:
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
        self.status: dict[str, dict[str, Any]] = {}
        self.received: list[tuple[str, str, list[str]]] = []  # (party, op, tensor names) of replies with tensors
        self.heads: dict[str, list] = {}  # the latest audit head each party reported
        self.uncommitted: int | None = None  # a step prepared everywhere whose commit has not been sent

    @property
    def links(self) -> dict[str, LinkStats]:
        return {n: c.stats for n, c in self.clients.items()}

    def close(self) -> None:
        for pool in (self._pool, self._sender_pool):
            if pool is not None:
                pool.shutdown()
        for c in self.clients.values():
            c.close()

    def __enter__(self) -> SplitDriver:
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
        if not sequenced:
            seq = 0
        elif seq is None:
            with self._seq_lock:
                seq = self._sent_seq = max(self.seq, self._sent_seq) + 1
        try:
            out = self.clients[party].call(Message(op, self.session, step, seq, meta or {}, tensors or {}),
                                           timeout or self.cfg.timeout_s)
        except ModelwardError:
            if sequenced:  # the party did not take this number: the next request reuses it
                with self._seq_lock:
                    self._sent_seq = self.seq
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
        self._check_chain()
        return self.status

    def _check_chain(self) -> None:
        st = [self.status[n] for n in self.names]
        all_layers = st[0]["all_layers"]
        joined = [lay for s in st for lay in s["layers"]]
        if joined != all_layers:
            raise PartyError(f"the parties' layers {[s['layers'] for s in st]} (in config order "
                             f"{self.names}) do not chain into the model's layers {all_layers}")
        if not st[0]["first"] or not st[-1]["last"]:
            raise PartyError("the first party must hold the inputs and the last one the labels")
        for a, b in zip(st[:-1], st[1:], strict=True):
            if a["next"] != b["party"] or b["prev"] != a["party"]:
                raise PartyError(f"{a['party']} says its next party is {a['next']!r} and {b['party']} says its "
                                 f"previous one is {b['prev']!r}; the config's chain is {self.names}")
            if a["out_shape"] != b["in_shape"]:
                raise PartyError(f"{a['party']} outputs {a['out_shape']} but {b['party']} expects {b['in_shape']}")
        if st[0]["n_train"] != st[-1]["n_train"] or st[0]["n_test"] != st[-1]["n_test"]:
            raise PartyError(f"inputs ({st[0]['n_train']}/{st[0]['n_test']} train/test samples) and labels "
                             f"({st[-1]['n_train']}/{st[-1]['n_test']}) are not aligned")

    # ------------------------------------------------------------------ passes
    def train_step(self, step: int, idx: torch.Tensor, lazy: bool = False) -> float:
        """One protocol step for all parties (phase 1 along the chain, then commit everywhere); returns the
        training loss. On any error every party aborts step `step` (bit-identical state) and the error is raised.

        With `lazy`, the commit of this step travels with the next step's request (one round trip less per step;
        :meth:`flush` sends it explicitly)."""
        loss = self._finish_step(step, self._send_step(step, idx, self.uncommitted, ahead=False), None)
        if not lazy:
            self.flush()
        return loss

    def _pipelined(self) -> bool:
        if self.pipeline is not None:
            return self.pipeline
        from modelward.governance.client import InProcessClient

        return not isinstance(self.clients[self.names[0]], InProcessClient)

    def _send_step(self, step: int, idx: torch.Tensor, commit: int | None, ahead: bool) -> Future:
        """Send step `step` (carrying the commit of step `commit`), numbered now, in order. `ahead`: on a helper
        thread, so that the next step can be sent before this one is answered; otherwise right here."""
        from concurrent.futures import Future, ThreadPoolExecutor

        with self._seq_lock:
            seq = self._sent_seq = max(self.seq, self._sent_seq) + 1
        meta = {} if commit is None else {"commit": commit}
        args = (self.names[0], "step", step, meta, {"idx": idx}, None, seq)
        if ahead:
            if self._sender_pool is None:
                self._sender_pool = ThreadPoolExecutor(2, thread_name_prefix="driver-send")
            return self._sender_pool.submit(self.call, *args)
        done: Future = Future()
        try:
            done.set_result(self.call(*args))
        except ModelwardError as e:
            done.set_exception(e)
        return done

    def _finish_step(self, step: int, sent: Future, ahead: tuple[int, Future] | None) -> float:
        """The answer to step `step` (its loss). On an error, the step sent after it (`ahead`, if any) is waited
        for, every party settles the step before (committed, or aborted with StepRolledBack if a party's late
        check refused it) and aborts this one (and the one ahead, should it have gone through), then the error is
        raised."""
        try:
            loss = float(sent.result().meta["loss"])
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
        return loss

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
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(max_workers=min(8, len(self.names)), thread_name_prefix="driver")
        return self._pool

    def abort_all(self, step: int) -> None:
        """Best effort: a party that cannot be reached aborts by itself (it never committed)."""
        for n in self.names:
            try:
                self.call(n, "abort", step)
            except ModelwardError:
                pass

    def evaluate(self, metric: str = "error", batch_size: int = 1024) -> float:
        """Test loss like core.train.evaluate, computed along the chain (the label holder scores its labels).

        A step still to be committed is committed by the first request, along the chain as a step carries the
        commit of the one before (the state scored is the one every party voted for); if that request fails,
        :meth:`flush` settles the step (committed everywhere, or aborted everywhere) before the error is raised."""
        n = int(self.status[self.names[0]]["n_test"])
        total = 0.0
        for i in range(0, n, batch_size):
            idx = torch.arange(i, min(n, i + batch_size))
            meta: dict[str, Any] = {"split": "test", "metric": metric}
            carried = self.uncommitted
            if carried is not None:
                meta["commit"] = carried
            try:
                total += float(self.call(self.names[0], "eval", 0, meta, {"idx": idx}).meta["sum"])
            except ModelwardError:
                if carried is not None:
                    self.flush()  # vote and commit rounds (StepRolledBack, after aborting, if a party refused)
                raise
            self.uncommitted = None
        return total / n

    def predict(self, split: str = "test", x: torch.Tensor | None = None, batch_size: int = 256) -> torch.Tensor:
        """Logits for the data owner's `split` (or for inputs `x`) through the whole chain; every party consents
        to inference, and the label holder hands the logits to the driver only."""
        outs = []
        first, last = self.names[0], self.names[-1]
        n = len(x) if x is not None else int(self.status[first][f"n_{split}"])
        for i in range(0, n, batch_size):
            j = min(n, i + batch_size)
            t = {"x": x[i:j]} if x is not None else {"idx": torch.arange(i, j)}
            token = self.call(first, "predict", 0, {"split": split}, t).meta["token"]
            outs.append(self.call(last, "fetch", 0, {"token": token}).tensors["logits"])
        return torch.cat(outs)

    # ------------------------------------------------------------------ recovery
    def wait_all(self, deadline: float, train: bool) -> None:
        while True:
            try:
                self.open(train)
                return
            except PartyUnavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def resume_point(self) -> int:
        """Continue where all parties are, if they agree and none is mid-step; otherwise restore every party to
        the latest checkpoint step they all hold."""
        prepared = {s["prepared"] for s in self.status.values() if s["prepared"] is not None}
        for p in prepared:
            self.abort_all(p)
        steps = {int(s["step"]) for s in self.status.values()}
        if len(steps) == 1:
            return steps.pop()
        common = set.intersection(*(set(s["checkpoints"]) for s in self.status.values()))
        target = max(common)
        for n in self.names:
            self.call(n, "restore", target, {"to_step": target})
        return target

    # ------------------------------------------------------------------ training loop
    def train(self, on_step: Callable[[int, float, dict[str, LinkStats]], None] | None = None,
              on_eval: Callable[[int, float], None] | None = None, out_dir: Path | None = None) -> SplitTrainResult:
        cfg, tc = self.cfg, self.cfg.train
        t0 = time.perf_counter()
        self.wait_all(time.monotonic() + cfg.retry_s, train=True)
        n_train = int(self.status[self.names[0]]["n_train"])
        step = self.resume_point()
        curve: list[tuple[int, float]] = []
        rows: list[dict[str, Any]] = []
        train_loss: list[tuple[int, float]] = []
        resumes = 0
        if out_dir is not None and (out_dir / "curve.json").is_file():
            prev = json.loads((out_dir / "curve.json").read_text())
            curve = [(int(s), float(v)) for s, v in prev if int(s) <= step]
            rows = [r for r in _read_rows(out_dir / "steps.csv") if int(r["step"]) < step]
        running, k = 0.0, 0

        def rewind(to: int):
            it = batch_order(n_train, tc.batch_size, cfg.seed)
            for _ in range(to):
                next(it)
            return it

        batches = rewind(step)
        if step == 0 or not curve:
            curve = [(step, self.evaluate(tc.loss, tc.eval_batch_size))]
            if on_eval:
                on_eval(*curve[-1])
        pipelined = self._pipelined()
        ahead: tuple[int, Future] | None = None  # the next step, sent before this one's answer
        # the first party delivers a step sent ahead in order once it has answered one from us (InOrder): not
        # before the first step of the loop, nor before the first after a resume
        through = False
        while step < tc.steps:
            before = {n: (s.sent, s.received, s.seconds) for n, s in self.links.items()}
            ts = time.perf_counter()
            if ahead is not None and ahead[0] == step:
                sent, ahead = ahead[1], None
            else:
                idx = next(batches)
                sent = self._send_step(step, idx, self.uncommitted, ahead=pipelined)
            nxt = step + 1
            if pipelined and through and nxt < tc.steps and nxt % tc.eval_every != 0:
                # step s+1 carries the commit of step s: the first party runs it only once step s is through
                # there (its answer sent); should step s fail, step s+1 is refused (out of order) and aborted
                ahead = (nxt, self._send_step(nxt, next(batches), step, ahead=True))
            try:
                loss = self._finish_step(step, sent, ahead)
            except PartyUnavailable:
                ahead, through = None, False  # (the step ahead was waited for by _finish_step)
                if cfg.retry_s <= 0:
                    raise
                self.wait_all(time.monotonic() + cfg.retry_s, train=True)
                step = self.resume_point()
                resumes += 1
                batches = rewind(step)
                curve = [c for c in curve if c[0] <= step]
                rows = [r for r in rows if r["step"] < step]
                running, k = 0.0, 0
                continue
            through = True
            row: dict[str, Any] = {"step": step, "loss": loss, "seconds": time.perf_counter() - ts}
            for n, s in self.links.items():
                row[f"{n}_sent"] = s.sent - before[n][0]
                row[f"{n}_received"] = s.received - before[n][1]
                row[f"{n}_seconds"] = round(s.seconds - before[n][2], 6)
            rows.append(row)
            step += 1
            running, k = running + loss, k + 1
            if on_step:
                on_step(step, loss, self.links)
            if step % tc.eval_every == 0 or step == tc.steps:
                # the evaluation carries the commit of the last step: it scores a state every party voted for
                curve.append((step, self.evaluate(tc.loss, tc.eval_batch_size)))
                train_loss.append((step, running / max(k, 1)))
                running, k = 0.0, 0
                if on_eval:
                    on_eval(*curve[-1])
                if out_dir is not None:
                    _write_progress(out_dir, curve, rows)
        self.flush()
        # one status round, all parties at once: the link statistics, and the heads to publish (a control answer
        # comes after its party's audit sync, so they rest on records on stable storage; every answer carries its
        # party's head, its record of that request included)
        statuses = self._status_all()
        heads = {n: self.heads[n] for n in self.names}
        result = SplitTrainResult(curve, step, time.perf_counter() - t0, self.link_summary(statuses), resumes,
                                  heads, train_loss)
        if out_dir is not None:
            _write_progress(out_dir, curve, rows)
        return result

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


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return [{k: (int(v) if k == "step" else float(v)) for k, v in r.items()} for r in csv.DictReader(f)]


def _write_progress(out_dir: Path, curve: list[tuple[int, float]], rows: list[dict[str, Any]]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "curve.json").write_text(json.dumps(curve))
    if rows:
        write_csv(out_dir / "steps.csv", rows, list(rows[0]))


def run_training(cfg: SplitConfig, on_step=None, on_eval=None, host: Party | None = None) -> SplitTrainResult:
    """`modelward split train`: resumable (the session id lives in out_dir/session.json); writes curve.json,
    steps.csv (per step: loss, seconds, bytes per link), summary.json and the resolved config.

    Args:
        cfg: the :class:`SplitConfig` (the parties must be serving).
        on_step: optional callback ``on_step(step, loss, links)`` after every training step.
        on_eval: optional callback ``on_eval(step, test_loss)`` after every evaluation.
        host: a party hosted in this process (:func:`governance.server.hosted_party`; ``split train --host``):
            reached directly instead of over the network.

    Returns:
        A :class:`SplitTrainResult` (``curve``, ``steps_run``, ``seconds``, bytes per ``links``, ``resumes``,
        the parties' ``audit_heads`` and ``train_loss``).

    Example:
        >>> result = run_training(load_split_config("split.toml"))  # doctest: +SKIP
        >>> result.curve[-1]  # (step, test loss)  # doctest: +SKIP
    """
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sess_file = out / "session.json"
    session = cfg.session
    if session is None and sess_file.is_file():
        session = json.loads(sess_file.read_text())["session"]
    session = session or uuid.uuid4().hex
    sess_file.write_text(json.dumps({"session": session}))
    dump_config(cfg, out / "config.json")
    with SplitDriver(cfg, session, connect=None if host is None else hosted_connect(host, cfg)) as drv:
        res = drv.train(on_step, on_eval, out)
        drv.checkpoint_all()  # the trained state is durable on every party when `split train` returns
    summary = {"steps": res.steps_run, "seconds": res.seconds, "resumes": res.resumes,
               "final_loss": res.curve[-1][1], "links": res.links, "audit_heads": res.audit_heads}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return res
