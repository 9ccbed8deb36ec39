"""The tentative step of a party: snapshot, late update, check, rollback, settle (two-phase commit, phase 1).

A party applies its optimizer step *tentatively*: the state before the step (parameters, buffers, optimizer state
and hyper-parameters) is kept until the driver commits or aborts it, and ``rollback`` restores it bit for bit.
Three single-thread executors keep this off the step's critical path:

- the *copier* copies the parameters and the optimizer state into reused buffers while the forward and backward
  passes run (nothing changes them before ``opt.step()``);
- the *updater* runs the late part of a step (weight gradients, optimizer step, check) after the input gradient
  went back to the previous party, at idle CPU priority by default: it has slack, while the transport and the
  other parties' work that run meanwhile are the step's critical path (the gain is measured in
  docs/benchmarks/governance.md);
- a *normal-priority updater*, used from the step after a late part was starved at idle priority.

A party's vote on a step is therefore late: every request first waits for the late part (:meth:`settle`); a failed
check rolls the step back and the party refuses to commit it (:meth:`refuse_rolled_back`).

Example:
    >>> t = TentativeStep("bob", segment, max_abs_param=lambda: 1e6)  # doctest: +SKIP
    >>> snapshot = t.begin(s)  # doctest: +SKIP
    >>> ...  # forward, backward
    >>> t.prepared = snapshot()  # doctest: +SKIP
    >>> t.run_late(s, weight_pass, snapshot, request=("alice", session, seq))  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from modelward.core.process import idle_priority
from modelward.core.threads import torch_thread_pool
from modelward.core.train import TrainConfig
from modelward.errors import ModelwardError
from modelward.governance.party.tensors import max_abs
from modelward.governance.protocol import NumericError, StepRolledBack


@dataclass
class Prepared:
    """A step applied tentatively: the state before it, to restore bit for bit on abort."""

    step: int
    model: dict[str, torch.Tensor]
    opt: dict[str, Any]


@dataclass
class LateFailure:
    """A late part that failed: the step (rolled back now), the reason, and the request it belonged to
    (``(caller, session, seq)``, for the party's audit record)."""

    step: int
    reason: str
    request: tuple[str, str, int]


@dataclass
class _Late:
    """The late part of a prepared step running on the update thread, and the request it belongs to."""

    future: Future
    snapshot: Callable[[], Prepared]
    request: tuple[str, str, int]


class TentativeStep:
    """Owns the live tensor views of a segment, the rollback buffers and the executors of a tentative step.

    Args:
        name: the party's name (thread names, error messages).
        segment: the party's segment (its parameters and buffers are updated in place, so the views stay live).
        max_abs_param: the check's bound on every parameter and buffer after an update, read at every check
            (``lambda: cfg.max_abs_param``: the party's configuration may change while it runs).
        update_priority: ``"idle"`` or ``"normal"``: the CPU priority of the late part.

    Attributes:
        opt / train_cfg: the optimizer and the training configuration of the session (None before one opens).
        prepared: the step applied tentatively, if any (:class:`Prepared`).
        rolled_back: ``(step, reason)`` of a step whose late check failed (refused until aborted).
        update_priority: ``"idle"``, ``"normal"``, or ``"normal (…why…)"`` after a starved late part.
    """

    def __init__(self, name: str, segment: torch.nn.Module, max_abs_param: Callable[[], float],
                 update_priority: str = "idle") -> None:
        self.name, self._max_abs_param = name, max_abs_param
        self.params = dict(segment.named_parameters())
        # parameters and buffers, detached views of the live storage (every update is in place): what a step
        # snapshots, restores and checks, without rebuilding state_dict() each time
        self.live = dict(segment.state_dict())
        self.param_keys = [k for k in self.live if k in self.params]
        self.buffer_keys = [k for k in self.live if k not in self.params]  # BatchNorm statistics and the like
        # a further check of the tentative update, after the numeric one: (step, the state before it) -> None, or a
        # ModelwardError that rolls the step back (the party's integrity statistics)
        self.extra_check: Callable[[int, Prepared], None] | None = None
        # what runs on the gradients just before the optimizer step: (step, parameters) -> None (the party's
        # bounded influence: it may scale them)
        self.pre_update: Callable[[int, list[torch.Tensor]], None] | None = None
        self.opt: torch.optim.Optimizer | None = None
        self.train_cfg: TrainConfig | None = None
        self.prepared: Prepared | None = None
        self.rolled_back: tuple[int, str] | None = None
        # reused rollback buffers, two sets (by step parity): while a step's commit waits for the parties after
        # this one, the next step's snapshot must not overwrite it
        # (a pipelined session, several steps prepared at once, uses `ring` sets: see PIPELINE_RING)
        self.ring = 2
        self._backups: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
        self._opt_backups: dict[tuple[int, int], dict[tuple[int, str], torch.Tensor]] = {}
        # the prepared steps older than `prepared`, oldest first (only a pipelined session has any: the commit of a
        # step arrives while the steps after it are prepared already)
        self.earlier: list[Prepared] = []
        self._copier = torch_thread_pool(1, f"snapshot-{name}")
        self.configured_priority = update_priority
        self.update_priority = update_priority
        self._updater = torch_thread_pool(1, f"update-{name}",
                                         initializer=idle_priority if update_priority == "idle" else None)
        self._updater_normal: ThreadPoolExecutor | None = None  # after a starved late update (see late_update)
        self._pending: _Late | None = None

    # ----------------------------------------------------------------- snapshot and rollback
    def begin(self, step: int) -> Callable[[], Prepared]:
        """Start copying the state before step `step` into buffers reused from step to step (one set per step
        parity): parameters, buffers (BatchNorm statistics) and the optimizer's per-parameter state and
        hyper-parameters. The buffers (which the forward pass updates) and the hyper-parameters are copied now;
        the parameters and the optimizer state, which nothing changes before ``opt.step()``, are copied by a
        helper thread while the forward and backward passes run. Returns the function that waits for the copy
        and gives the snapshot (call it before the update, and before any rollback)."""
        assert self.opt is not None
        live = self.live
        slot = (self.ring, step % self.ring)
        bk = self._backups.get(slot)
        if bk is None or list(bk) != list(live) or any(bk[k].shape != v.shape for k, v in live.items()):
            bk = self._backups[slot] = {k: torch.empty_like(v) for k, v in live.items()}
        opt_backup = self._opt_backups.setdefault(slot, {})
        if self.buffer_keys:
            torch._foreach_copy_([bk[k] for k in self.buffer_keys], [live[k] for k in self.buffer_keys])
        dst: list[torch.Tensor] = [bk[k] for k in self.param_keys]
        src: list[torch.Tensor] = [live[k] for k in self.param_keys]
        opt_state: dict[int, dict[str, Any]] = {}
        for i, p in enumerate(self.params.values()):
            st = self.opt.state.get(p)
            if not st:
                continue
            saved: dict[str, Any] = {}
            for k, v in st.items():
                if torch.is_tensor(v):
                    buf = opt_backup.get((i, k))
                    if buf is None or buf.shape != v.shape or buf.dtype != v.dtype:
                        buf = opt_backup[(i, k)] = torch.empty_like(v)
                    dst.append(buf)
                    src.append(v)
                    saved[k] = buf
                else:
                    saved[k] = copy.deepcopy(v)
            opt_state[i] = saved
        groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in self.opt.param_groups]
        snap = Prepared(step, bk, {"state": opt_state, "groups": groups})
        if not dst:
            return lambda: snap
        copying = self._copier.submit(torch._foreach_copy_, dst, src)

        def done() -> Prepared:
            copying.result()
            return snap

        return done

    def rollback(self, snap: Prepared) -> None:
        """Back to the state before the step: parameters, buffers (BatchNorm statistics) and optimizer state."""
        assert self.opt is not None
        live = self.live
        with torch.no_grad():
            torch._foreach_copy_(list(live.values()), [snap.model[k] for k in live])
        params = list(self.params.values())
        self.opt.state.clear()
        for i, saved in snap.opt["state"].items():
            self.opt.state[params[i]] = {k: (v.clone() if torch.is_tensor(v) else copy.deepcopy(v))
                                         for k, v in saved.items()}
        for g, saved in zip(self.opt.param_groups, snap.opt["groups"], strict=True):
            g.update(copy.deepcopy(saved))
        self.opt.zero_grad(set_to_none=True)

    def all_prepared(self) -> list[Prepared]:
        """Every step prepared and neither committed nor aborted, oldest first."""
        return [*self.earlier, *([self.prepared] if self.prepared is not None else [])]

    def count(self) -> int:
        """How many steps are prepared (0 or 1, except in a pipelined session)."""
        return len(self.earlier) + (self.prepared is not None)

    def push(self, snap: Prepared) -> None:
        """`snap` is the newest prepared step; the one prepared before it (if any) stays prepared, older."""
        if self.prepared is not None:
            self.earlier.append(self.prepared)
        self.prepared = snap

    def find(self, step: int) -> Prepared | None:
        """The prepared step `step`, if it is prepared."""
        return next((p for p in self.all_prepared() if p.step == step), None)

    def commit_upto(self, step: int) -> None:
        """Keep every prepared step up to `step` (their snapshots are dropped; the later ones stay prepared)."""
        keep = [p for p in self.all_prepared() if p.step > step]
        self.earlier, self.prepared = keep[:-1], (keep[-1] if keep else None)

    def abort(self, step: int, committed: int | None = None) -> None:
        """Phase 2 on a refusal: restore the state before the prepared step `step`; in a pipelined session the
        steps prepared after it are rolled back with it (they were computed from it). No-op if `step` is not
        prepared, or (`committed`: the steps before it are committed) where the earliest prepared step at or after
        `step` is rolled back instead, when `step` itself was never prepared here; a step the late check rolled
        back may be run again."""
        undo = [p for p in self.all_prepared() if p.step == step or
                (committed is not None and step >= committed and p.step >= step)]
        if undo:
            first = min(undo, key=lambda p: p.step)
            self.rollback(first)
            keep = [p for p in self.all_prepared() if p.step < first.step]
            self.earlier, self.prepared = keep[:-1], (keep[-1] if keep else None)
        if self.rolled_back is not None and self.rolled_back[0] >= step:
            self.rolled_back = None  # aborted everywhere now; the step may be run again

    def drop(self) -> None:
        """Roll back whatever is prepared (a restore, or a clean stop): back to the oldest prepared step."""
        every = self.all_prepared()
        if every:
            self.rollback(every[0])
        self.earlier, self.prepared = [], None

    # ----------------------------------------------------------------- the update and its check
    def check(self, step: int) -> None:
        """After the tentative update: every parameter and buffer finite and within max_abs_param. One fused
        L2 norm per tensor bounds its largest entry (max |x| <= ||x||_2) and is non-finite iff an entry is; only
        when that bound is exceeded does the exact per-tensor search run (to decide, and to name the culprit)."""
        floats = [v for v in self.live.values() if v.is_floating_point() and v.numel()]
        if not floats:
            return
        limit = self._max_abs_param()
        m = float(torch.stack(torch._foreach_norm(floats)).max())
        if m <= limit:
            return
        for k, v in self.live.items():
            if v.is_floating_point():
                mk = max_abs(v)
                if not mk <= limit:
                    raise NumericError(f"party {self.name}: the update of step {step} leaves {k} with max "
                                       f"|value| {mk:.3g} (limit max_abs_param = {limit:g}, or "
                                       "non-finite); the step is rolled back and refused")
        if not math.isfinite(m):
            raise NumericError(f"party {self.name}: the update of step {step} is not finite; rolled back")

    def update(self, step: int, snapshot: Callable[[], Prepared]) -> None:
        """The optimizer step on the gradients computed, then the check of its result."""
        assert self.opt is not None and self.train_cfg is not None
        snap = snapshot()  # the copy of the parameters is complete before they change
        for g in self.opt.param_groups:
            g["lr"] = self.train_cfg.lr_at(step)
        if self.pre_update is not None:
            self.pre_update(step, list(self.params.values()))
        self.opt.step()
        self.check(step)
        if self.extra_check is not None:
            self.extra_check(step, snap)

    def late_update(self, step: int, weight_pass: Callable[[], None], snapshot: Callable[[], Prepared]) -> None:
        """The late part of a step (update thread): the weight gradients, then the update and its check.

        At idle priority, a late part that took far longer than the CPU time it used (more than 4x, and over
        0.1 s) was starved by other work on the host: the next steps run theirs at normal priority."""
        wall, cpu = time.monotonic(), time.thread_time()
        try:
            weight_pass()
            self.update(step, snapshot)
        finally:
            wall, cpu = time.monotonic() - wall, time.thread_time() - cpu
            if self.update_priority == "idle" and wall > max(0.1, 4 * cpu):
                self.update_priority = (f"normal (the late part of step {step} took {wall:.2f} s for {cpu:.3f} s "
                                        "of CPU at idle priority)")

    def late_pool(self) -> ThreadPoolExecutor:
        """The executor of the next late part: the idle-priority one, or the normal one after starvation."""
        if self.update_priority == "idle" or self.configured_priority == "normal":
            return self._updater
        if self._updater_normal is None:
            self._updater_normal = torch_thread_pool(1, f"update-{self.name}-normal")
        return self._updater_normal

    def run_late(self, step: int, weight_pass: Callable[[], None], snapshot: Callable[[], Prepared],
                 request: tuple[str, str, int], here: bool = False) -> None:
        """Run the late part of step `step` on the update thread, or `here` (on the calling thread: the first
        party, whose caller waits for nothing but the loss and whose update no party's work overlaps, saves the
        hand-over; its check is still a late vote, reported to the next request)."""
        if here:
            late: Future = Future()
            try:
                self.late_update(step, weight_pass, snapshot)
                late.set_result(None)
            except BaseException as e:  # noqa: BLE001 - any failure of the update refuses the step (in settle)
                late.set_exception(e)
        else:
            late = self.late_pool().submit(self.late_update, step, weight_pass, snapshot)
        self._pending = _Late(late, snapshot, request)

    def settle(self) -> LateFailure | None:
        """Wait for the late part of the prepared step. If its check failed, the step is rolled back
        (bit-identical) and returned as a :class:`LateFailure` for the party's audit record: the party refuses
        to commit it (vote, commit, or the next step carrying the commit), so the driver aborts it everywhere."""
        late, self._pending = self._pending, None
        if late is None:
            return None
        try:
            late.future.result()
            return None
        except BaseException as e:  # noqa: BLE001 - any failure of the update refuses the step
            reason = str(e) if isinstance(e, ModelwardError) else f"update failed: {type(e).__name__}: {e}"
        snap = late.snapshot()
        if "rolled back" not in reason:
            reason += f"; step {snap.step} rolled back"
        self.rollback(snap)
        self.prepared = self.earlier.pop() if self.earlier else None  # (the steps before it stay prepared)
        self.rolled_back = (snap.step, reason)
        return LateFailure(snap.step, reason, late.request)

    def refuse_rolled_back(self, step: int) -> None:
        """Raise StepRolledBack if step `step` failed its late check here (until it is aborted)."""
        if self.rolled_back is not None and self.rolled_back[0] == step:
            raise StepRolledBack(self.rolled_back[1])

    def close(self) -> None:
        """Let a late update in flight finish (its step stays prepared) and stop the executors."""
        for pool in (self._updater, self._updater_normal):
            if pool is not None:
                pool.shutdown()
        self._copier.shutdown()
