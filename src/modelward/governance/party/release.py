"""What leaves a party: the one release path (issue 36 item 1; docs/governance.md, "What leaves a party").

Every value a party sends to another passes :meth:`ReleasePath.release` with its receiver, its kind and its rows,
and an operation builds its answer only from released values (:meth:`ReleasePath.reply` refuses anything else).
What each kind may carry, and what it costs, is one table, :data:`KINDS`:

=============  ==================  =====================================================  ==========================
kind           receiver            mechanism                                              charged
=============  ==================  =====================================================  ==========================
``gradient``   previous party      the label holder's ``[label_protection]`` (Marvell),   the step (step budgets)
                                   noise keyed by (step, index)
``activation`` next party          its own data (``[compression]`` on the wire)           nothing
``eval_sum``   caller              the rows of one evaluation (all its parts), each       rows, 1 answer, privacy
                                   clipped to [0, C], summed, + N(0, (σ·C·m)²)
``train_loss`` caller (with an     committed steps only: their rows' losses clipped to    1 answer, privacy
               evaluation)         [0, C], summed, + N(0, (σ·C·m)²); an aborted step's
                                   loss never leaves
``prediction`` ``fetch`` caller    the owner's ``predict.form``                           rows, 1 answer
``relay``      caller              a value the next party released, passed on             where it was computed
``status``     caller              counts, shapes, step numbers, tokens, digests          nothing
=============  ==================  =====================================================  ==========================

(m: the most times one index occurs among the rows of the answer; σ, C: the policy's ``noise`` and ``clip``.)

**An aggregate over rows the receiver chose is a query answer.** The previous party chooses every activation it
sends, so a sum over seven fixed rows and one probe, asked twice, is the probe's value (eval differencing), and a
step's loss before an abort is a label oracle. So no per-step quantity but the gradient leaves a step (the loss
waits for the commit and leaves only summed over committed steps), and every sum leaves with Gaussian noise
calibrated to what one row can change: one row moves an answer by at most C·m, the noise has standard deviation
σ·C·m, whatever the receiver chose. Each answer is then a Gaussian mechanism with noise multiplier σ, and the
answers a receiver gets compose as μ-GDP with μ² = Σ 1/σ² (Dong, Roth & Su 2022, "Gaussian Differential Privacy",
JRSS-B 84(1), Cor. 3.3: exact for full-batch Gaussian mechanisms), converted to (ε, δ) by their Cor. 2.13
(:func:`gdp_epsilon`; the tests check it against Opacus' PRV and RDP accountants). An answer that would take its
receiver past ``privacy.epsilon_per_day`` (or ``epsilon_total``), or past its answer budget, is withheld: the pass
runs, its answer says why, nothing else leaves.

**The ledger is the audit log.** The charge of an answer (kind, answers, μ²) is written into the audit record of
the request that carries it (the gate appends the party's note), the record that already counts its rows: one
record, one transaction, the row budgets' restart story. :class:`Ledger` reads the charges back from the log for a
receiver on its first answer of a UTC day (so a restart, a new session or a new party process resets nothing).

Example:
    >>> path = ReleasePath("bob", FlowPolicy(), ledger=None, seed=0)
    >>> r = path.release("alice", "eval_sum", torch.ones(8), idx=torch.arange(8), metric="error")
    >>> r.kind, isinstance(r.value, float)
    ('eval_sum', True)
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from modelward.governance.audit import AuditLog
from modelward.governance.flow_policy import FlowPolicy, Release
from modelward.governance.wire import Codec, Message


@dataclass(frozen=True)
class Kind:
    """One row of the release table: who receives a value of this kind, what is done to it, what it costs."""

    name: str
    receiver: str
    mechanism: str
    charge: str
    noisy: bool = False


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("gradient", "previous party", "label holder: [label_protection] (Marvell), noise keyed by (step, index)",
         "the step (step budgets)"),
    Kind("activation", "next party", "the party's own data ([compression] on the wire)", "nothing"),
    Kind("eval_sum", "caller", "rows of one evaluation clipped to [0, C], summed, + N(0, (sigma*C*m)^2)",
         "rows, 1 answer, mu^2 = 1/sigma^2", noisy=True),
    Kind("train_loss", "caller of an evaluation", "committed steps only; rows clipped to [0, C], summed, "
         "+ N(0, (sigma*C*m)^2)", "1 answer, mu^2 = 1/sigma^2", noisy=True),
    Kind("prediction", "fetch caller", "the owner's predict.form", "rows, 1 answer"),
    Kind("relay", "caller", "a value the next party released, passed on unchanged", "where it was computed"),
    Kind("status", "caller", "counts, shapes, step numbers, tokens, digests", "nothing"),
)}


# ----------------------------------------------------------------------------------------------- the accountant
def _phi(x: float) -> float:
    """The standard normal CDF."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def gdp_delta(mu: float, epsilon: float) -> float:
    """δ(ε) of a μ-GDP mechanism: Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (Dong, Roth & Su 2022, Cor. 2.13)."""
    if mu <= 0:
        return 0.0
    tail = _phi(-epsilon / mu - mu / 2)
    second = math.exp(epsilon + math.log(tail)) if tail > 0 else 0.0
    return max(0.0, _phi(-epsilon / mu + mu / 2) - second)


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest ε with δ(ε) ≤ `delta` for a μ-GDP mechanism (bisection; 0 for μ = 0, inf for μ = inf).

    Example:
        >>> round(gdp_epsilon(math.sqrt(20) / 4, 1e-6), 2)  # 20 answers at noise multiplier 4
        5.55
    """
    if mu <= 0:
        return 0.0
    if not math.isfinite(mu):
        return math.inf
    lo, hi = 0.0, 1.0
    while gdp_delta(mu, hi) > delta:
        lo, hi = hi, hi * 2
        if hi > 1e6:
            return math.inf
    for _ in range(100):
        mid = (lo + hi) / 2
        if gdp_delta(mu, mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def gdp_mu(epsilon: float, delta: float) -> float:
    """The largest μ whose μ-GDP guarantee is within (ε, δ): the μ² budget an ``epsilon`` buys (bisection)."""
    lo, hi = 0.0, 1.0
    while gdp_delta(hi, epsilon) <= delta:
        lo, hi = hi, hi * 2
        if hi > 1e4:
            return hi
    for _ in range(100):
        mid = (lo + hi) / 2
        if gdp_delta(mid, epsilon) <= delta:
            lo = mid
        else:
            hi = mid
    return lo


# ----------------------------------------------------------------------------------------------- the ledger
TOKEN = re.compile(r"release:(\{[^{}]{0,200}\})")


@dataclass
class Usage:
    """What a receiver has been answered (in a UTC day, or ever): answers, and μ² (Σ 1/σ² of its noisy answers)."""

    answers: int = 0
    mu2: float = 0.0
    by_kind: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, answers: int, mu2: float) -> None:
        self.answers += answers
        self.mu2 += mu2
        self.by_kind[kind] = self.by_kind.get(kind, 0) + answers


def parse_charges(reason: str) -> list[tuple[str, int, float]]:
    """The charges written into one audit reason: ``[(kind, answers, mu2)]`` (negative numbers count as 0: a
    charge can only be added, never taken back, whatever text a record holds)."""
    out = []
    for m in TOKEN.finditer(reason):
        try:
            c = json.loads(m.group(1))
            out.append((str(c.get("k", "?"))[:32], max(0, int(c.get("a", 0))), max(0.0, float(c.get("mu2", 0.0)))))
        except (ValueError, TypeError, AttributeError):
            continue
    return [(k, a, m if math.isfinite(m) else 0.0) for k, a, m in out]


class Ledger:
    """Answers and μ² per receiving peer, per UTC day and ever, kept in the audit log.

    Each charge goes into the note of the request that carries the answer (:meth:`charge` returns it; the gate
    writes it into that request's record). A receiver's usage is read back from the log the first time it is
    asked for in a UTC day, then kept current in memory.

    Args:
        audit: the party's audit log (None: memory only, for tests).
        clock: UNIX time (tests pass a fixed one).
    """

    def __init__(self, audit: AuditLog | None, clock: Callable[[], float] = time.time) -> None:
        self.audit, self.clock = audit, clock
        self._day: dict[tuple[str, str], Usage] = {}
        self._ever: dict[str, Usage] = {}

    @staticmethod
    def _midnight(now: float) -> tuple[str, float]:
        d = dt.datetime.fromtimestamp(now, dt.UTC)
        m = d.replace(hour=0, minute=0, second=0, microsecond=0)
        return m.date().isoformat(), m.timestamp()

    def _read(self, receiver: str, since: float | None) -> Usage:
        u = Usage()
        if self.audit is None:
            return u
        q = "SELECT reason FROM audit WHERE caller = ? AND decision = 'allow' AND reason LIKE '%release:%'"
        args: list[Any] = [receiver]
        if since is not None:
            q += " AND ts >= ?"
            args.append(since)
        with self.audit.lock:  # (the log's own connection and lock: a read between two appends)
            rows = self.audit.db.execute(q, args).fetchall()
        for (reason,) in rows:
            for kind, answers, mu2 in parse_charges(reason):
                u.add(kind, answers, mu2)
        return u

    def today(self, receiver: str) -> Usage:
        """`receiver`'s usage in the current UTC day."""
        day, since = self._midnight(self.clock())
        key = (receiver, day)
        if key not in self._day:
            if len(self._day) > 4096:  # bounded: old days and forgotten peers go
                self._day.clear()
            self._day[key] = self._read(receiver, since)
        return self._day[key]

    def ever(self, receiver: str) -> Usage:
        """`receiver`'s usage since the log began."""
        if receiver not in self._ever:
            if len(self._ever) > 4096:
                self._ever.clear()
            self._ever[receiver] = self._read(receiver, None)
        return self._ever[receiver]

    def charge(self, receiver: str, kind: str, answers: int, mu2: float) -> str:
        """Count an answer to `receiver` now; returns the note for the record of the request that carries it."""
        self.today(receiver).add(kind, answers, mu2)
        if receiver in self._ever:
            self._ever[receiver].add(kind, answers, mu2)
        return " release:" + json.dumps({"k": kind, "a": answers, "mu2": round(mu2, 9)}, separators=(",", ":"))


# ----------------------------------------------------------------------------------------------- pending sums
@dataclass
class _Sum:
    """Rows summed so far for one answer: exact total, clipped total, rows, indices (for the multiplicity)."""

    exact: float = 0.0
    clipped: float = 0.0
    rows: int = 0
    steps: int = 0
    idx: list[torch.Tensor] = field(default_factory=list)

    def add(self, exact: float, clipped: float, idx: torch.Tensor) -> None:
        self.exact += exact
        self.clipped += clipped
        self.rows += len(idx)
        self.steps += 1
        self.idx.append(idx)

    def multiplicity(self) -> int:
        """The most times one index occurs in the rows summed (what one row's label can move the sum by)."""
        if not self.idx:
            return 1
        return int(torch.unique(torch.cat(self.idx), return_counts=True)[1].max())


@dataclass(frozen=True)
class Released:
    """A value as it may leave (``value`` None: withheld). Only :meth:`ReleasePath.release` makes them."""

    kind: str
    value: Any
    note: str = ""


class ReleasePath:
    """The release path of one party (module docstring): every outgoing value, its mechanism and its charge.

    Args:
        name: the party's name (errors, notes).
        flow: the party's flow policy (``[eval]``, ``[train_loss]``, ``[predict]``, ``[privacy]``).
        ledger: the party's audit log (the charges are read back from it), or None (memory only).
        protect: the label holder's gradient protection, ``protect() -> ProtectReply | None`` (read at every
            release: an operator may switch it while the party runs), or None.
        predict: the label holder's release of prediction outputs (``flow_policy.Release``), or None.
        seed: tests only: a fixed noise stream (a seed the receiver knows lets it subtract the noise). Default: the
            OS CSPRNG.
        clock: UNIX time (the UTC day of the budgets).

    Example:
        >>> path = ReleasePath("bob", FlowPolicy(), ledger=None, seed=0)
        >>> path.hold_loss(0, torch.full((8,), 2.3), 2.3, torch.arange(8))
        >>> path.committed(0)
        >>> round(path.release("alice", "train_loss", None).value["mean"], 1)  # doctest: +SKIP
        2.3
    """

    def __init__(self, name: str, flow: FlowPolicy, ledger: AuditLog | None, *,
                 protect: Callable[[], Any] | None = None, predict: Release | None = None, seed: int | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.name, self.flow = name, flow
        self.ledger = Ledger(ledger, clock)
        self._protect, self._predict = protect, predict
        self._gen = torch.Generator().manual_seed(secrets.randbits(63) if seed is None else seed)
        self.note = ""  # the charges of the current request (the party's note: the gate writes it into its record)
        self._held: dict[int, tuple[float, float, torch.Tensor]] = {}  # step -> (mean loss, clipped sum, idx)
        self._window = _Sum()  # committed steps whose loss has not left yet
        self._evals: dict[tuple[str, str], tuple[int, int, _Sum]] = {}  # (receiver, session) -> (next, parts, sum)

    # ------------------------------------------------------------------------------------------ the entry point
    def release(self, receiver: str, kind: str, value: Any, **ctx: Any) -> Released:
        """`value` as it may leave for `receiver` (a :class:`Released`; ``value`` None if withheld). ``ctx``: what
        the kind's mechanism needs (``idx``, ``step``, ``labels``, ``metric``, ``session``, ``part``)."""
        if kind not in KINDS:
            raise KeyError(f"release: unknown kind {kind!r}; valid: {', '.join(KINDS)}")
        mech = getattr(self, f"_{kind}")
        return mech(receiver, value, **ctx)

    def reply(self, op: str, step: int = 0, *, meta: dict[str, Released] | None = None,
              tensors: dict[str, Released] | None = None, codecs: dict[str, Codec] | None = None,
              anchors: dict[str, list] | None = None) -> Message:
        """The answer of an operation, built from released values only (a raw value raises TypeError). Withheld
        values are left out; ``withheld`` names them and why. `anchors`: the audit heads of the parties after this
        one (protocol metadata the gate records, not data)."""
        out_meta: dict[str, Any] = {}
        out_tensors: dict[str, torch.Tensor] = {}
        withheld: list[str] = []
        for store, items in ((out_meta, meta or {}), (out_tensors, tensors or {})):
            for k, r in items.items():
                if not isinstance(r, Released):
                    raise TypeError(f"party {self.name}: {op} reply field {k!r} did not pass the release path")
                if r.value is None and r.kind in ("eval_sum", "train_loss", "prediction"):
                    withheld.append(f"{k}: {r.note}")
                    continue
                if store is out_tensors and isinstance(r.value, dict):
                    out_tensors.update(r.value)
                else:
                    store[k] = r.value
        if withheld:
            out_meta["withheld"] = "; ".join(withheld)[:512]
            self.note += "; withheld " + out_meta["withheld"]  # (in the request's audit record too)
        if anchors:
            out_meta["_anchors"] = anchors
        return Message(op, step=step, meta=out_meta, tensors=out_tensors,
                       codecs={k: c for k, c in (codecs or {}).items() if k in out_tensors})

    # ------------------------------------------------------------------------------------------ the kinds
    def _gradient(self, receiver: str, value: torch.Tensor, *, step: int = 0, idx: torch.Tensor | None = None,
                  **_: Any) -> Released:
        protect = self._protect() if self._protect is not None else None
        if protect is not None and idx is not None:
            value = protect.gradient(value, idx, step)
        return Released("gradient", value)

    def _activation(self, receiver: str, value: torch.Tensor, **_: Any) -> Released:
        return Released("activation", value)

    def _relay(self, receiver: str, value: Any, **_: Any) -> Released:
        return Released("relay", value)

    def _status(self, receiver: str, value: Any, **_: Any) -> Released:
        return Released("status", value)

    def _prediction(self, receiver: str, value: torch.Tensor, **_: Any) -> Released:
        if self._predict is None:
            return Released("prediction", None, "only the label holder releases predictions")
        cap = self.flow.predict.max_answers_per_day
        if cap is not None and self.ledger.today(receiver).by_kind.get("prediction", 0) + 1 > cap:
            return Released("prediction", None, f"{receiver!r} has had its {cap} answers today (UTC) "
                                                "(policy.predict.max_answers_per_day)")
        self.note += self.ledger.charge(receiver, "prediction", 1, 0.0)
        return Released("prediction", self._predict.release(value))

    def _eval_sum(self, receiver: str, value: torch.Tensor, *, idx: torch.Tensor, metric: str = "error",
                  exact: float | None = None, session: str = "", part: tuple[int, int] = (0, 1),
                  **_: Any) -> Released:
        """`value`: the per-row metric of this part of an evaluation (0/1 errors, or cross-entropies); `exact`: its
        sum as the monolithic evaluation computes it (what ``noise = 0`` releases, bit for bit). The parts of one
        evaluation are summed here; only the last one's answer carries the (noisy) total."""
        cfg = self.flow.eval
        i, k = part
        key = (receiver, session)
        nxt, parts, acc = self._evals.pop(key, (0, k, None))
        if acc is None or i != nxt or k != parts:  # a new evaluation (an unfinished one leaves nothing)
            acc = _Sum()
        if i != 0 and acc.rows == 0:
            return Released("eval_sum", None, f"part {i} of {k} without parts 0..{i - 1} before it")
        clip = 1.0 if metric == "error" else cfg.clip
        v = value.detach().double()
        acc.add(float(v.sum()) if exact is None else exact, float(v.clamp(0.0, clip).sum()), idx)
        if i + 1 < k:
            if len(self._evals) > 256:  # bounded: evaluations left unfinished by many sessions
                self._evals.clear()
            self._evals[key] = (i + 1, k, acc)
            return Released("eval_sum", None, f"part {i + 1} of {k}: the sum leaves with the last part")
        return self._noisy(receiver, "eval_sum", acc, cfg.noise, clip, cfg.max_answers_per_day, "eval")

    def _train_loss(self, receiver: str, value: Any = None, **_: Any) -> Released:
        """The committed steps' training loss since the last release (``value`` unused): ``{"mean", "steps",
        "rows"}``, or None when no step was committed since (or the budget is spent)."""
        acc, self._window = self._window, _Sum()
        if acc.steps == 0:
            return Released("train_loss", None, "no step committed since the last release")
        cfg = self.flow.train_loss
        r = self._noisy(receiver, "train_loss", acc, cfg.noise, cfg.clip, None, "train_loss")
        if r.value is None:
            return r
        mean = acc.exact / acc.steps if cfg.noise == 0 else r.value / acc.rows
        return Released("train_loss", {"mean": mean, "steps": acc.steps, "rows": acc.rows}, r.note)

    def _noisy(self, receiver: str, kind: str, acc: _Sum, sigma: float, clip: float, max_answers: int | None,
               table: str) -> Released:
        """The Gaussian mechanism with its checks: the answer budget, the privacy budget, then the charge."""
        usage = self.ledger.today(receiver)
        if max_answers is not None and usage.by_kind.get(kind, 0) + 1 > max_answers:
            return Released(kind, None, f"{receiver!r} has had its {max_answers} {kind} answers today (UTC) "
                                        f"(policy.{table}.max_answers_per_day)")
        if sigma == 0:  # the owner's opt-out: exact, no privacy bound
            self.note += self.ledger.charge(receiver, kind, 1, 0.0)
            return Released(kind, acc.exact, "exact (noise = 0)")
        mu2 = 1.0 / sigma ** 2
        p = self.flow.privacy
        eps = gdp_epsilon(math.sqrt(usage.mu2 + mu2), p.delta)
        if eps > p.epsilon_per_day:
            return Released(kind, None, f"{receiver!r}'s privacy budget today is spent (epsilon "
                                        f"{gdp_epsilon(math.sqrt(usage.mu2), p.delta):.2f} of "
                                        f"policy.privacy.epsilon_per_day = {p.epsilon_per_day:g}; UTC day)")
        if p.epsilon_total is not None:
            ever = self.ledger.ever(receiver)
            if gdp_epsilon(math.sqrt(ever.mu2 + mu2), p.delta) > p.epsilon_total:
                return Released(kind, None, f"{receiver!r}'s privacy budget is spent "
                                            f"(policy.privacy.epsilon_total = {p.epsilon_total:g})")
        sd = sigma * clip * acc.multiplicity()
        noisy = acc.clipped + sd * float(torch.randn((), generator=self._gen, dtype=torch.float64))
        self.note += self.ledger.charge(receiver, kind, 1, mu2)
        return Released(kind, noisy, f"gaussian sd {sd:.3g} (epsilon today {eps:.2f})")

    # ------------------------------------------------------------------------------------------ training losses
    def hold_loss(self, step: int, per_row: torch.Tensor, mean: float, idx: torch.Tensor) -> None:
        """Keep the loss of prepared step `step` (per row, and the step's mean) until it commits or aborts."""
        clipped = float(per_row.detach().double().clamp(0.0, self.flow.train_loss.clip).sum())
        self._held[step] = (mean, clipped, idx.detach().clone())

    def committed(self, upto: int) -> None:
        """Steps up to `upto` are committed: their losses join the window that leaves with the next evaluation."""
        for s in sorted(s for s in self._held if s <= upto):
            mean, clipped, idx = self._held.pop(s)
            self._window.add(mean, clipped, idx)

    def aborted(self, start: int | None = None) -> None:
        """Steps from `start` on (every prepared one: None) are undone: their losses are dropped, never released."""
        for s in [s for s in self._held if start is None or s >= start]:
            del self._held[s]

    def restored(self) -> None:
        """The party went back to a checkpoint: prepared and committed-but-unreleased losses are dropped (the steps
        after the checkpoint are run again and counted then)."""
        self._held.clear()
        self._window = _Sum()
