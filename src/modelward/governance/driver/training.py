"""Split training: the resumable loop over the coordinator, and ``modelward split train`` (:func:`run_training`).

Data order, learning-rate schedule and optimizer are exactly those of :func:`modelward.core.train.train`, so split
training reproduces monolithic training when the parties start from the same parameters. When a party disappears
mid-step, the loop waits for it, every party is restored to the latest checkpoint step they all hold
(:meth:`~modelward.governance.driver.coordinator.Coordinator.resume_point`), the seeded batch order is rewound to
that step and training continues: no step is lost or applied twice. With ``staleness`` = k (opt-in) the loop
keeps the first party's link k + 1 steps deep (:meth:`SplitDriver.train`): each answer lists the steps finished, a
drain empties the pipeline before every evaluation and at the end, and a failure settles the last finished step
everywhere and aborts the rest before resuming. Progress goes to a :class:`~modelward.core.progress.ProgressSink`;
the outputs are written through :mod:`modelward.core.records`
(atomic: a reader, or a resumed run, never sees half a file).

Example:
    >>> result = run_training(load_split_config("split.toml"))  # doctest: +SKIP
    >>> result.curve[-1]  # (step, test loss)  # doctest: +SKIP
"""

from __future__ import annotations

import csv
import json
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelward.core.config import dump_config
from modelward.core.progress import ProgressSink, as_sink
from modelward.core.records import atomic_write_json, write_csv
from modelward.core.train import batch_order
from modelward.errors import ModelwardError
from modelward.governance.driver.config import SplitConfig
from modelward.governance.driver.connect import hosted_connect
from modelward.governance.driver.coordinator import Coordinator
from modelward.governance.party.machine import Party
from modelward.governance.protocol import LinkStats, PartyUnavailable
from modelward.governance.wire import WireError

PROGRESS_KEY = "split train"


@dataclass
class SplitTrainResult:
    """What a split training run did: the test curve ``[(step, loss)]``, the steps run, the seconds, bytes per
    link, how often it resumed after a party failed, the parties' audit heads, and the training loss per
    evaluation interval as the label holder released it (the mean over the steps committed since its previous
    answer, with its noise; an interval it withheld is missing)."""

    curve: list[tuple[int, float]]
    steps_run: int
    seconds: float
    links: dict[str, dict[str, float]]
    resumes: int
    audit_heads: dict[str, list]
    train_loss: list[tuple[int, float]] = field(default_factory=list)


class SplitDriver(Coordinator):
    """The coordinator of one split with its training loop (:meth:`train`).

    Args:
        cfg, session, connect, pipeline, staleness: as for
            :class:`~modelward.governance.driver.coordinator.Coordinator` (their one description).

    Example:
        >>> with SplitDriver(load_split_config("split.toml")) as drv:  # doctest: +SKIP
        ...     res = drv.train(RecordingProgress())
    """

    def train(self, progress: ProgressSink | None = None, out_dir: Path | None = None, *,
              on_step: Callable[[int, float, dict[str, LinkStats]], None] | None = None) -> SplitTrainResult:
        """Train ``cfg.train.steps`` steps from where the parties are (resuming after a party's failure).

        Args:
            progress: where progress goes (key ``"split train"``: one unit per step, the loss, the last test loss
                and the driver's bytes in the status line).
            out_dir: where ``curve.json`` and ``steps.csv`` are kept up to date (and read back to resume).
            on_step: called after every step with ``(steps done, the last training loss released, the driver's
                link statistics)`` (a hook for monitoring, and for tests that fail a party at a given step; no
                step's own loss ever leaves the label holder, so the loss is that of the last evaluation interval,
                NaN before the first).

        Returns:
            A :class:`SplitTrainResult`.
        """
        sink = as_sink(progress)
        cfg, tc = self.cfg, self.cfg.train
        t0 = time.perf_counter()
        sink.start(PROGRESS_KEY, tc.steps, PROGRESS_KEY)
        self.wait_all(time.monotonic() + cfg.retry_s, train=True)
        n_train = int(self.status[self.names[0]]["n_train"])
        step = self.resume_point()
        shown = 0  # the step the sink has been told about
        curve: list[tuple[int, float]] = []
        rows: list[dict[str, Any]] = []
        train_loss: list[tuple[int, float]] = []
        resumes = 0
        if out_dir is not None and (out_dir / "curve.json").is_file():
            prev = json.loads((out_dir / "curve.json").read_text())
            curve = [(int(s), float("nan") if v is None else float(v)) for s, v in prev if int(s) <= step]
            rows = [r for r in _read_rows(out_dir / "steps.csv") if int(r["step"]) < step]

        def rewind(to: int):
            it = batch_order(n_train, tc.batch_size, cfg.seed)
            for _ in range(to):
                next(it)
            return it

        def report(info: str) -> None:
            nonlocal shown
            sink.advance(PROGRESS_KEY, step - shown, info)
            shown = step

        def last_loss() -> float:
            return train_loss[-1][1] if train_loss else float("nan")

        def status() -> str:
            ctl = sum(s.sent + s.received for s in self.links.values())  # the driver's links: no tensors
            last = curve[-1][1] if curve else float("nan")
            return f"loss {last_loss():.3f}  L {last:.3f}  driver {ctl / 2**10:.0f} KiB"

        batches = rewind(step)
        report(f"from step {step}")
        pipelined = self._pipelined()
        ahead: tuple[int, Future] | None = None  # the next step, sent before this one's answer
        # the first party delivers a step sent ahead in order once it has answered one from us (InOrder): not
        # before the first step of the loop, nor before the first after a resume
        through = False
        # bounded staleness (self.staleness = k > 0): requests sent and not answered (at most 2 when pipelined),
        # the next step to send, and whether the drain before the next evaluation point is sent
        stale = self.staleness
        pending: list[tuple[int, Future]] = []
        next_send, drained, reordered = step, False, 0

        def recover() -> None:
            """After a party failed (during a step or an evaluation): wait for every party within cfg.retry_s
            (backing off), restore them to the step they all hold and rewind the data order to it; what was
            recorded after that step is dropped (it is recomputed, so every eval point appears once)."""
            nonlocal step, batches, curve, rows, train_loss, resumes, ahead, through, next_send, drained
            ahead, through = None, False  # (a step ahead was waited for by _finish_step)
            self.wait_all(time.monotonic() + cfg.retry_s, train=True)
            step = self.resume_point()
            resumes += 1
            batches = rewind(step)
            curve = [c for c in curve if c[0] <= step]
            train_loss = [c for c in train_loss if c[0] <= step]
            rows = [r for r in rows if r["step"] < step]
            next_send, drained = step, False
            report(f"a party failed: resumed from step {step}")

        def record(s: int, ts: float, before: dict) -> None:
            """A finished step's row (the link statistics since `before`), progress and hook."""
            nonlocal step
            row: dict[str, Any] = {"step": s, "seconds": time.perf_counter() - ts}
            for n, st in self.links.items():
                row[f"{n}_sent"] = st.sent - before[n][0]
                row[f"{n}_received"] = st.received - before[n][1]
                row[f"{n}_seconds"] = round(st.seconds - before[n][2], 6)
            rows.append(row)
            step = s + 1
            if on_step:
                on_step(step, last_loss(), self.links)
            report(status())

        while True:
            # an evaluation at the start, at every eval_every steps and at the end; after a resume to an eval point
            # whose score is kept, not again (the restored state is bit-identical to the one scored)
            due = step % tc.eval_every == 0 or step == tc.steps
            if not curve or (due and curve[-1][0] != step):
                try:
                    # the evaluation carries the commit of the last step: it scores a state every party voted for
                    score = self.evaluate(tc.loss, tc.eval_batch_size)
                except PartyUnavailable:
                    if cfg.retry_s <= 0:
                        raise
                    recover()
                    continue
                curve.append((step, score))
                if self.train_loss is not None:  # the committed steps since the last evaluation, as released
                    train_loss.append((step, float(self.train_loss["mean"])))
                report(status() if rows else f"L {score:.3f}")
                if out_dir is not None and len(curve) > 1:
                    _write_progress(out_dir, curve, rows)
            if step >= tc.steps:
                break
            before = {n: (s.sent, s.received, s.seconds) for n, s in self.links.items()}
            ts = time.perf_counter()
            if stale:
                # bounded staleness: the first party keeps `stale` steps in flight on its link; each answer lists
                # the steps it finished. Before an evaluation point (and the end) a drain finishes them all
                boundary = min(tc.steps, (step // tc.eval_every + 1) * tc.eval_every)
                while not drained and len(pending) < (2 if pipelined and through else 1):
                    if next_send < boundary:
                        pending.append((next_send, self._send_stale(next_send, next(batches), self.uncommitted)))
                        next_send += 1
                    else:
                        pending.append((boundary, self._send_stale(boundary, None, None)))
                        drained = True
                _, fut = pending.pop(0)
                try:
                    done = fut.result().meta["done"]
                except ModelwardError as e:
                    others, pending = [f for _, f in pending], []
                    step = self.settle_pipeline(others, step)
                    rows = [r for r in rows if r["step"] < step]
                    batches, next_send, drained, through = rewind(step), step, False, False
                    # a request sent ahead that the first party took out of turn (its predecessor was still running
                    # after InOrder's wait) was refused unread: send it again, at most a few times in a row
                    reorder = isinstance(e, WireError) and "out-of-order" in str(e) and reordered < 3
                    reordered = reordered + 1 if reorder else 0
                    if reorder:
                        continue
                    if not isinstance(e, PartyUnavailable) or cfg.retry_s <= 0:
                        raise
                    recover()
                    continue
                reordered = 0
                through = True
                for i, s_done in enumerate(done):
                    self.uncommitted = int(s_done)
                    record(int(s_done), ts, before if i == 0 else
                           {n: (st.sent, st.received, st.seconds) for n, st in self.links.items()})
                if drained and not pending:
                    drained = False
                continue
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
                self._finish_step(step, sent, ahead)
            except WireError as e:
                # a step sent ahead that the first party took before its predecessor had even arrived (InOrder's
                # wait for an absent predecessor is bounded) was refused unread by its sequence guard: nothing ran
                # anywhere, the step before is settled (committed everywhere) and this one aborted, so sending it
                # again from the same batch gives the state of a sequential run; at most a few times in a row
                if "out-of-order" not in str(e) or reordered >= 3:
                    raise
                reordered += 1
                ahead, through, batches = None, False, rewind(step)
                continue
            except PartyUnavailable:
                if cfg.retry_s <= 0:
                    raise
                recover()
                continue
            reordered = 0
            through = True
            record(step, ts, before)
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
        sink.done(PROGRESS_KEY, f"test {tc.loss} {curve[-1][1]:.4f}")
        return result

    def train_to_checkpoint(self, progress: ProgressSink | None = None, out_dir: Path | None = None,
                            export: bool = False) -> tuple[SplitTrainResult, dict[str, dict[str, Any]]]:
        """:meth:`train`, then make the trained state durable on every party (:meth:`checkpoint_all`). Should a
        party be unavailable for the checkpoint round, the driver waits for it (``cfg.retry_s``, with backoff)
        and trains again from where the parties are — nothing if they all still hold the trained state, the
        steps since their common checkpoint if one restarted from an older one — then checkpoints again.

        Returns:
            ``(result, {party: checkpoint answer})`` (``export``: each party also writes its parameters).

        Example:
            >>> with SplitDriver(cfg) as drv:  # doctest: +SKIP
            ...     res, ckpts = drv.train_to_checkpoint()
        """
        deadline = time.monotonic() + self.cfg.retry_s
        resumes = 0
        while True:
            res = self.train(progress, out_dir)
            resumes += res.resumes
            try:
                ckpts = self.checkpoint_all(export=export)
            except PartyUnavailable:
                if time.monotonic() >= deadline:
                    raise
                resumes += 1
                continue
            res.resumes = resumes
            return res, ckpts


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return [{k: (int(v) if k == "step" else float(v)) for k, v in r.items()} for r in csv.DictReader(f)]


def _write_progress(out_dir: Path, curve: list[tuple[int, float]], rows: list[dict[str, Any]]) -> None:
    atomic_write_json(out_dir / "curve.json", curve, indent=None)
    if rows:
        write_csv(out_dir / "steps.csv", rows, list(rows[0]))


def run_training(cfg: SplitConfig, progress: ProgressSink | None = None, host: Party | None = None
                 ) -> SplitTrainResult:
    """`modelward split train`: resumable (the session id lives in out_dir/session.json); writes curve.json,
    steps.csv (per step: loss, seconds, bytes per link), summary.json and the resolved config.

    Args:
        cfg: the :class:`SplitConfig` (the parties must be serving).
        progress: where progress goes (:meth:`SplitDriver.train`).
        host: a party hosted in this process (:func:`governance.transport.server.hosted_party`;
            ``split train --host``): reached directly instead of over the network.

    Returns:
        A :class:`SplitTrainResult` (``curve``, ``steps_run``, ``seconds``, bytes per ``links``, ``resumes``,
        the parties' ``audit_heads`` and ``train_loss``).

    Example:
        >>> result = run_training(load_split_config("split.toml"), RecordingProgress())  # doctest: +SKIP
        >>> result.curve[-1]  # (step, test loss)  # doctest: +SKIP
    """
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sess_file = out / "session.json"
    session = cfg.session
    if session is None and sess_file.is_file():
        session = json.loads(sess_file.read_text())["session"]
    session = session or uuid.uuid4().hex
    atomic_write_json(sess_file, {"session": session}, indent=None)
    dump_config(cfg, out / "config.json")
    with SplitDriver(cfg, session, connect=None if host is None else hosted_connect(host, cfg)) as drv:
        res, _ = drv.train_to_checkpoint(progress, out)  # durable on every party when `split train` returns
    summary = {"steps": res.steps_run, "seconds": res.seconds, "resumes": res.resumes,
               "final_loss": res.curve[-1][1], "links": res.links, "audit_heads": res.audit_heads}
    atomic_write_json(out / "summary.json", summary)
    return res
