"""Per-pass consent (seed 000 §1: "each party has to consent to every forward and backward pass").

A :class:`Policy` is evaluated by :class:`ConsentChecker` before any compute, for every forward and backward pass
through a party's segment. Everything is denied unless the policy allows it: the caller must be a listed peer, the
purpose (training / inference) must be enabled, and the limits (steps per session, passes per UTC day, batch size,
UTC time window) must hold. An optional approval hook — a Python callable ``pkg.mod:fn`` or an external command —
is asked last, once per session or for every pass. Counts come from the audit log, so they survive restarts.
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

from modelward.core.config import StrictModel
from modelward.errors import ConfigError
from modelward.governance.audit import AuditLog

Purpose = Literal["train", "eval", "predict"]
PASS_OPS = ("forward", "backward", "loss_backward")
STEP_OPS = ("backward", "loss_backward")
_WINDOW = re.compile(r"^([01]\d|2[0-4]):([0-5]\d)-([01]\d|2[0-4]):([0-5]\d)$")


class Policy(StrictModel):
    """A party's consent policy; the defaults deny everything."""

    allow_peers: list[str] = Field(default_factory=list)  # certificate common names that may call this party
    training: bool = False  # forward+backward passes that update parameters (and evaluation during training)
    inference: bool = False  # forward passes for predictions
    max_steps_per_session: int | None = Field(None, ge=0)
    max_passes_per_day: int | None = Field(None, ge=0)  # forward/backward requests per UTC day, all sessions
    max_batch: int | None = Field(None, ge=1)
    window_utc: str | None = None  # "HH:MM-HH:MM" (may wrap midnight)
    approval: str | None = None  # python callable "pkg.mod:fn", called with the request as a dict -> bool
    approval_command: list[str] | None = None  # command reading the request JSON on stdin, printing yes/no
    approval_scope: Literal["session", "pass"] = "session"
    approval_timeout_s: float = Field(10.0, gt=0)

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
    op: str  # forward | backward | loss_backward | restore | checkpoint
    purpose: str  # train | eval | predict
    session: str
    step: int
    batch: int


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str


def _minutes(hhmm: str) -> int:
    h, m = hhmm.split(":")
    return int(h) * 60 + int(m)


def in_window(window: str, now: dt.datetime) -> bool:
    start, end = (_minutes(p) for p in window.split("-"))
    t = now.hour * 60 + now.minute
    return start <= t < end if start <= end else (t >= start or t < end)


def load_hook(spec: str) -> Callable[[dict], object]:
    if ":" not in spec:
        raise ConfigError(f"policy.approval {spec!r}: expected 'package.module:function'")
    mod, fn = spec.split(":", 1)
    try:
        return getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"policy.approval {spec!r}: cannot load ({e})") from None


class ConsentChecker:
    """Evaluates a Policy for each pass; decisions are the caller's to audit."""

    def __init__(self, policy: Policy, audit: AuditLog, now: Callable[[], dt.datetime] | None = None) -> None:
        self.policy, self.audit = policy, audit
        self.now = now or (lambda: dt.datetime.now(dt.UTC))
        self.hook = load_hook(policy.approval) if policy.approval else None
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
        if req.purpose in ("train", "eval") and not p.training:
            return Decision(False, "training is not allowed by this party's policy (policy.training = false)")
        if req.purpose == "predict" and not p.inference:
            return Decision(False, "inference is not allowed by this party's policy (policy.inference = false)")
        if p.max_batch is not None and req.batch > p.max_batch:
            return Decision(False, f"batch of {req.batch} exceeds policy.max_batch = {p.max_batch}")
        now = self.now()
        if p.window_utc and not in_window(p.window_utc, now):
            return Decision(False, f"outside the allowed time window {p.window_utc} UTC (now {now:%H:%M})")
        if p.max_steps_per_session is not None and req.op in STEP_OPS and req.purpose == "train":
            done = self.audit.count(STEP_OPS, session=req.session)
            if done >= p.max_steps_per_session:
                return Decision(False, f"session {req.session!r} has used its {p.max_steps_per_session} training "
                                       "steps (policy.max_steps_per_session)")
        if p.max_passes_per_day is not None and req.op in PASS_OPS:
            midnight = now.replace(hour=0, minute=0, second=0, microsecond=0).timestamp()
            done = self.audit.count(PASS_OPS, since=midnight)
            if done >= p.max_passes_per_day:
                return Decision(False, f"the daily limit of {p.max_passes_per_day} passes is used up "
                                       "(policy.max_passes_per_day)")
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
