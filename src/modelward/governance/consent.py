"""Per-pass consent (seed 000 §1: "each party has to consent to every forward and backward pass").

A :class:`Policy` is evaluated by :class:`ConsentChecker` before any compute, for every forward and backward pass
through a party's segment. Everything is denied unless the policy allows it: the caller must be a listed peer, the
purpose (training / inference) must be enabled, and the limits (steps per session, passes per UTC day, batch size,
UTC time window) must hold. An optional approval hook — a Python callable ``pkg.mod:fn`` or an external command —
is asked last, once per session or for every pass.

The purpose is never taken from the request: it follows from the operation the party is about to execute
(:data:`OP_PURPOSE`: a training ``step`` is training whatever the caller writes in its metadata). Step limits are
counted per peer from the audit log — per session, per UTC day and in total — so neither a new session id nor a
restart resets them.
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import re
import subprocess
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Literal

from pydantic import Field, field_validator, model_validator

from modelward.core.entrypoints import check_trusted
from modelward.errors import ConfigError
from modelward.governance.audit import AuditLog
from modelward.governance.flow_policy import Decision, FlowPolicy, FlowRequest, admit

Purpose = Literal["train", "inference"]
# what each operation is *for*, decided by the server from what it will execute (None: no consent needed beyond
# being a pinned, allowed peer: status, abort — an abort only ever restores the state before a refused step)
OP_PURPOSE: dict[str, str | None] = {
    "step": "train", "eval": "train", "vote": "train", "commit": "train", "restore": "train", "checkpoint": "train",
    "open_train": "train", "predict": "inference", "fetch": "inference", "open": None, "status": None,
    "abort": None, "anchor": None,
}
PASS_OPS = ("step", "eval", "predict")  # passes through the segment (counted by max_passes_per_day)
STEP_OPS = ("step",)  # training steps (counted by the step limits)


def purpose_of(op: str) -> str | None:
    """The purpose of an operation (KeyError-free: unknown operations are refused before this is asked)."""
    return OP_PURPOSE.get(op)
_WINDOW = re.compile(r"^([01]\d|2[0-4]):([0-5]\d)-([01]\d|2[0-4]):([0-5]\d)$")


class Policy(FlowPolicy):
    """A party's consent policy; the defaults deny everything. What may *leave* for each operation (prediction
    receiver and form, row budgets, distinct indices of an evaluation) is its flow part,
    :class:`~modelward.governance.flow_policy.FlowPolicy` (``[predict]``, ``[eval]``, ``eval_splits``,
    ``min_batch``), checked last by :func:`~modelward.governance.flow_policy.admit`.

    Args:
        allow_peers: pinned peer names that may call this party.
        training: allow training steps (forward+backward), evaluations during training, commits and restores.
        inference: allow forward passes for predictions.
        max_steps_per_session / max_steps_per_day / max_steps_total: step limits per peer (per session, per
            UTC day, ever; the audit log is the counter).
        max_passes_per_day: steps + evaluations + predictions per peer and UTC day.
        max_batch / min_batch: batch size limits (small batches leak more; an evaluation needs ``min_batch``
            distinct indices).
        eval_splits: the data splits evaluations may score (default ``["test"]``).
        predict / eval: the flow tables (:class:`~modelward.governance.flow_policy.PredictFlow`, ``EvalFlow``).
        window_utc: ``"HH:MM-HH:MM"`` when passes are allowed (may wrap midnight).
        approval / approval_command: a ``"pkg.mod:fn"`` hook or a command asked yes/no for a request;
            approval_scope: ask once per ``"session"`` or per ``"pass"``; approval_timeout_s: the command's time limit.

    Returns:
        A strict config, evaluated per pass by :class:`ConsentChecker`.

    Example:
        >>> p = Policy(allow_peers=["bob"], training=True, max_batch=256)
        >>> p.inference, p.eval_splits
        (False, ['test'])
    """

    allow_peers: list[str] = Field(default_factory=list)  # pinned peer names that may call this party
    training: bool = False  # training steps (forward+backward), evaluation during training, commits, restores
    inference: bool = False  # forward passes for predictions
    max_steps_per_session: int | None = Field(None, ge=0)  # per peer and session
    max_steps_per_day: int | None = Field(None, ge=0)  # per peer and UTC day, all sessions
    max_steps_total: int | None = Field(None, ge=0)  # per peer, ever (the audit log is the counter)
    max_passes_per_day: int | None = Field(None, ge=0)  # steps + evaluations + predictions per peer and UTC day
    max_batch: int | None = Field(None, ge=1)
    window_utc: str | None = None  # "HH:MM-HH:MM" (may wrap midnight)
    approval: str | None = None  # python callable "pkg.mod:fn", called with the request as a dict -> bool
    approval_command: list[str] | None = None  # command reading the request JSON on stdin, printing yes/no
    approval_scope: Literal["session", "pass"] = "session"
    approval_timeout_s: float = Field(10.0, gt=0)
    # approval and approval_command are code named by a config: they run only when the operator trusts it
    # (``code_trusted``: the trust list, allow_code, or --trust-code; core/entrypoints.py), never by a policy key

    @field_validator("window_utc")
    @classmethod
    def _window(cls, v: str | None) -> str | None:
        if v is not None and not _WINDOW.match(v):
            raise ValueError("expected 'HH:MM-HH:MM' in UTC, e.g. '08:00-18:00'")
        return v

    @model_validator(mode="after")
    def _one_hook(self) -> Policy:
        if self.approval and self.approval_command:
            raise ValueError("give either approval (python callable) or approval_command, not both")
        return self


@dataclass(frozen=True)
class PassRequest:
    party: str
    caller: str
    op: str  # the operation the party will execute (step, eval, predict, commit, restore, ...)
    purpose: str | None  # derived from op by the server (purpose_of), never sent by the caller
    session: str
    step: int
    batch: int
    split: str = ""  # the data split an evaluation or a prediction runs on (meta.split), "" otherwise
    distinct: int = -1  # distinct indices in the batch (-1: no indices)
    metric: str = "error"  # an evaluation's metric (the wire default)


__all__ = ["ConsentChecker", "Decision", "PassRequest", "Policy", "purpose_of"]


def _minutes(hhmm: str) -> int:
    h, m = hhmm.split(":")
    return int(h) * 60 + int(m)


def in_window(window: str, now: dt.datetime) -> bool:
    start, end = (_minutes(p) for p in window.split("-"))
    t = now.hour * 60 + now.minute
    return start <= t < end if start <= end else (t >= start or t < end)


def load_hook(spec: str, trusted: bool = False) -> Callable[[dict], object]:
    """The approval hook ``package.module:function`` a policy names: code, so imported only when the user trusts the
    policy's code (``--trust-code``, ``MODELWARD_TRUST_CODE=1``, ``modelward trust allow``); refused before any
    import otherwise."""
    if ":" not in spec:
        raise ConfigError(f"policy.approval {spec!r}: expected 'package.module:function'")
    check_trusted(spec, field="policy.approval", trusted=trusted)
    mod, fn = spec.split(":", 1)
    try:
        return getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"policy.approval {spec!r}: cannot load ({e})") from None


class ConsentChecker:
    """Evaluates a Policy for each pass; decisions are the caller's to audit.

    Args:
        policy: the party's :class:`Policy`.
        audit: the party's :class:`~modelward.governance.audit.AuditLog` (it counts past passes for the limits).
        now: a clock returning an aware UTC datetime (default: the system clock; tests pass a fixed one).

    Returns:
        The checker; ``check_peer(caller)`` and ``check(request)`` return a ``Decision(allowed, reason)``.

    Example:
        >>> import os, tempfile
        >>> from modelward.governance.audit import AuditLog
        >>> log = AuditLog(os.path.join(tempfile.mkdtemp(), "audit.db"), party="alice")
        >>> checker = ConsentChecker(Policy(allow_peers=["bob"]), log)
        >>> checker.check_peer("bob").allowed, checker.check_peer("eve").allowed
        (True, False)
        >>> log.close()
    """

    def __init__(self, policy: Policy, audit: AuditLog, now: Callable[[], dt.datetime] | None = None) -> None:
        self.policy, self.audit = policy, audit
        self.now = now or (lambda: dt.datetime.now(dt.UTC))
        self.hook = load_hook(policy.approval, policy.code_trusted) if policy.approval else None
        if policy.approval_command:  # a command the party would run on every request: code, too
            check_trusted(" ".join(policy.approval_command), field="policy.approval_command",
                          trusted=policy.code_trusted, source=policy.config_source)
        self._approved: dict[tuple[str, str, str], Decision] = {}
        self._lock = threading.Lock()

    def check_peer(self, caller: str) -> Decision:
        if caller not in self.policy.allow_peers:
            return Decision(False, f"caller {caller!r} is not an allowed peer of this party "
                                   f"(policy.allow_peers = {self.policy.allow_peers})")
        return Decision(True, "")

    def check(self, req: PassRequest) -> Decision:
        p = self.policy
        d = self.check_peer(req.caller)
        if not d.allowed:
            return d
        if req.purpose is None:
            return Decision(True, "peer")
        if req.purpose == "train" and not p.training:
            return Decision(False, f"{req.op} is training, and training is not allowed by this party's policy "
                                   "(policy.training = false)")
        if req.purpose == "inference" and not p.inference:
            return Decision(False, f"{req.op} is inference, and inference is not allowed by this party's policy "
                                   "(policy.inference = false)")
        if p.max_batch is not None and req.batch > p.max_batch:
            return Decision(False, f"batch of {req.batch} exceeds policy.max_batch = {p.max_batch}")
        if p.min_batch is not None and req.op in ("step", "eval") and 0 < req.batch < p.min_batch:
            return Decision(False, f"batch of {req.batch} is below policy.min_batch = {p.min_batch}")
        now = self.now()
        if p.window_utc and not in_window(p.window_utc, now):
            return Decision(False, f"outside the allowed time window {p.window_utc} UTC (now {now:%H:%M})")
        midnight = now.replace(hour=0, minute=0, second=0, microsecond=0).timestamp()
        if req.op in STEP_OPS and req.batch > 0:  # (a pipelined drain, no batch, only finishes steps admitted)
            limits = [(p.max_steps_per_session, {"session": req.session}, f"session {req.session!r}",
                       "max_steps_per_session"),
                      (p.max_steps_per_day, {"since": midnight}, "today (UTC)", "max_steps_per_day"),
                      (p.max_steps_total, {}, "in total", "max_steps_total")]
            for limit, where, what, key in limits:
                if limit is not None and \
                        self.audit.count(STEP_OPS, caller=req.caller, min_batch=1, **where) >= limit:
                    return Decision(False, f"peer {req.caller!r} has used its {limit} training steps {what} "
                                           f"(policy.{key}; counted from the audit log)")
        if p.max_passes_per_day is not None and req.op in PASS_OPS:
            done = self.audit.count(PASS_OPS, caller=req.caller, since=midnight)
            if done >= p.max_passes_per_day:
                return Decision(False, f"peer {req.caller!r} has used up the daily limit of "
                                       f"{p.max_passes_per_day} passes (policy.max_passes_per_day)")
        flow = admit(p, FlowRequest(req.op, req.caller, req.party, req.batch, req.distinct, req.split, req.metric),
                     self.audit, now)
        if not flow.allowed:
            return flow
        if self.hook is not None or p.approval_command:
            return self._approve(req)
        return Decision(True, "policy")

    def _approve(self, req: PassRequest) -> Decision:
        key = (req.session, req.purpose, req.caller)
        if self.policy.approval_scope == "session":
            with self._lock:
                if key in self._approved:
                    return self._approved[key]
        d = self._ask(req)
        if self.policy.approval_scope == "session":
            with self._lock:
                if len(self._approved) > 4096:  # bounded: sessions are cheap to open
                    self._approved.clear()
                self._approved[key] = d
        return d

    def _ask(self, req: PassRequest) -> Decision:
        payload = {**asdict(req), "scope": self.policy.approval_scope}
        if self.hook is not None:
            try:
                ok = bool(self.hook(payload))
            except Exception as e:  # a broken hook must deny, never crash the party
                return Decision(False, f"approval hook {self.policy.approval} failed: {type(e).__name__}: {e}")
            return Decision(ok, f"approval hook {self.policy.approval} answered {'yes' if ok else 'no'}")
        cmd = self.policy.approval_command or []
        try:
            out = subprocess.run(cmd, input=json.dumps(payload), capture_output=True, text=True,
                                 timeout=self.policy.approval_timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            return Decision(False, f"approval command {cmd[:1]} failed: {type(e).__name__}")
        words = out.stdout.strip().split()
        ok = out.returncode == 0 and bool(words) and words[0].lower() in ("yes", "y", "allow", "approve")
        return Decision(ok, f"approval command answered {words[0] if words else '(nothing)'!r}")
