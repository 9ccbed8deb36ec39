"""What may run, and what may leave, for each operation on a party: the information-flow policy (issue 26).

Consent (:mod:`.consent`) says *who* may run a pass. That is not enough: a neighbour that may run ``predict`` and
read its result can fit a copy of another party's part from 64 answers (a surrogate, Tramèr et al. 2016), and an
``eval`` over eight copies of one row is an exact soft-label oracle. This module decides, per operation, whether a
request may run *and* what of its result may leave the party, and it is the only place that does. It reads top to
bottom:

``predict``  (every party the pass crosses)
    1. the split is one the owner names (``predict.splits``, default ``["test"]``: predictions on the training
       split would hand the caller the training labels);
    2. the rows fit the caller's row budgets (``predict.max_rows_per_day``, ``predict.max_rows_total``; rows, not
       passes, counted from the audit log: a restart or a new session resets nothing).
``fetch``    (the party that holds the last part; it is the only one with outputs)
    3. the caller is the result's receiver (``predict.result_receiver``; by default nobody but the owner itself:
       **the party that holds the last part keeps its outputs**, so no party gets another's outputs on inputs it
       chose unless the owner opts in);
    4. what leaves is the owner's form (``predict.form``): ``label`` (argmax), ``topk`` (the k best classes, no
       scores), ``probs`` (softmax), or the project's own ModelGuard defenses applied to the softmax at the cut,
       ``modelguard_w`` / ``modelguard_s`` (ModelGuard, Tang et al. 2024, Eq. 5-7: ℓ1 distortion ≤ ``epsilon``,
       top-1 kept) — :func:`release`.
``eval``     (every party the pass crosses)
    5. the split is in ``policy.eval_splits`` and the metric in ``eval.metrics``;
    6. the batch holds at least ``policy.min_batch`` **distinct** indices (duplicates turn the sum into a
       per-sample oracle: 8 copies of ``(h, i)`` return 8·(logsumexp z − z_c));
    7. the rows fit the caller's eval row budgets (``eval.max_rows_per_day``, ``eval.max_rows_total``).

What an admitted request's answer may carry, with what noise and at what cost to its receiver (answers, privacy),
is the party's release path (:mod:`~modelward.governance.party.release`), configured by ``[eval]`` (``noise``,
``clip``, ``max_answers_per_day``), ``[train_loss]`` and ``[privacy]`` here.

Everything else (step limits, time window, approval hooks) stays in :class:`~.consent.ConsentChecker`, which
calls :func:`admit` last.

Example:
    >>> flow = FlowPolicy()
    >>> req = FlowRequest(op="fetch", caller="alice", owner="bob", rows=0)
    >>> admit(flow, req, NoUsage()).allowed
    False
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import torch
from pydantic import Field

from modelward.core.config import StrictModel
from modelward.core.records import write_csv
from modelward.errors import DataError
from modelward.extraction.defenses import make_defense

ResultForm = Literal["label", "topk", "probs", "modelguard_w", "modelguard_s", "logits"]
FORMS: tuple[str, ...] = ("label", "topk", "probs", "modelguard_w", "modelguard_s", "logits")
OWNER = "owner"  # result_receiver's default: the party holding the last part keeps its outputs


class PredictFlow(StrictModel):
    """``[predict]`` of a policy: who receives a prediction, in what form, on which split, how many rows.

    Args:
        result_receiver: the pinned name that may ``fetch`` results, or ``"owner"`` (default): the party holding
            the last part keeps its outputs (it writes them to its own folder).
        form: what leaves: ``label`` | ``topk`` | ``probs`` | ``modelguard_w`` | ``modelguard_s``, or ``logits``
            (everything the owner computed: only for a receiver trusted with a copy, e.g. one organisation running
            both parties, or a cost benchmark comparing raw outputs).
        top_k: classes returned by ``topk``.
        epsilon: the ModelGuard ℓ1 budget ε (``modelguard_w`` / ``modelguard_s``).
        splits: the data splits predictions may run on (``"inputs"``: inputs the first party's driver supplies).
        max_rows_per_day / max_rows_total: rows per peer and UTC day / ever (None: no limit).
        max_answers_per_day: fetched results per peer and UTC day (None: no limit).

    Returns:
        A strict config (``policy.predict``).

    Example:
        >>> PredictFlow().result_receiver, PredictFlow().form, PredictFlow().splits
        ('owner', 'label', ['test', 'inputs'])
    """

    result_receiver: str = OWNER
    form: ResultForm = "label"
    top_k: int = Field(3, ge=1)
    epsilon: float = Field(1.0, gt=0.0, le=2.0)  # ℓ1 distance between two points of the simplex is at most 2
    splits: list[Literal["train", "test", "inputs"]] = Field(default_factory=lambda: ["test", "inputs"])
    max_rows_per_day: int | None = Field(20_000, ge=0)
    max_rows_total: int | None = Field(None, ge=0)
    max_answers_per_day: int | None = Field(None, ge=0)  # fetched results per peer and UTC day


class EvalFlow(StrictModel):
    """``[eval]`` of a policy: which metrics an evaluation may return, its own row and answer budgets, and the noise
    its answer leaves with (``noise`` σ, ``clip`` C: each row's metric clipped to [0, C], Gaussian noise of sd
    σ·C·m on the sum, m the most times one index occurs; ``noise = 0``: exact).

    (The splits are ``policy.eval_splits`` and the smallest number of distinct indices ``policy.min_batch``.)

    Example:
        >>> EvalFlow().metrics
        ['error', 'cross_entropy']
    """

    metrics: list[Literal["error", "cross_entropy"]] = Field(default_factory=lambda: ["error", "cross_entropy"])
    max_rows_per_day: int | None = Field(200_000, ge=0)
    max_rows_total: int | None = Field(None, ge=0)
    # what leaves (governance.party.release): the sum over the rows of one evaluation, each row's metric clipped to
    # [0, clip] (error is 0 or 1), plus Gaussian noise of standard deviation noise x clip x (the most times one index
    # occurs); noise = 0: the exact sum (no privacy bound: an opt-out, like label_protection.method = "none")
    noise: float = Field(4.0, ge=0.0, le=1e6)
    clip: float = Field(4.0, gt=0.0, le=1e3)  # nats: a row's cross-entropy counts at most this much
    max_answers_per_day: int | None = Field(100, ge=0)  # released sums per peer and UTC day


class LossFlow(StrictModel):
    """``[train_loss]`` of a policy: how the training loss leaves the label holder. Never per step: the losses of
    *committed* steps are summed (each row clipped to [0, clip] nats) and released with the next evaluation's
    answer, with Gaussian noise of standard deviation noise x clip x (the most times one index occurs in the window);
    an aborted step's loss never leaves. ``noise = 0``: the exact mean of the committed steps' losses.

    Example:
        >>> LossFlow().noise, LossFlow().clip
        (8.0, 4.0)
    """

    noise: float = Field(8.0, ge=0.0, le=1e6)
    clip: float = Field(4.0, gt=0.0, le=1e3)


class PrivacyBudget(StrictModel):
    """``[privacy]`` of a policy: the privacy accountant of every noisy answer (evaluation sums, training-loss
    windows), per receiving peer: ``epsilon_per_day`` (UTC day) and ``epsilon_total`` (ever; None: no lifetime
    bound) at ``delta``. An answer that would exceed either is withheld (the pass itself runs; its record says why).

    Example:
        >>> PrivacyBudget().epsilon_per_day, PrivacyBudget().delta
        (8.0, 1e-06)
    """

    epsilon_per_day: float = Field(8.0, gt=0.0, le=1e4)
    epsilon_total: float | None = Field(None, gt=0.0)
    delta: float = Field(1e-6, gt=0.0, lt=0.1)


class FlowPolicy(StrictModel):
    """The flow part of a party's policy, with the two consent fields it shares.

    Args:
        predict / eval / train_loss / privacy: :class:`PredictFlow`, :class:`EvalFlow`, :class:`LossFlow`,
            :class:`PrivacyBudget` (what leaves, and the accountant of the noisy answers).
        eval_splits: the splits evaluations may score; min_batch: the fewest distinct indices per pass.

    Example:
        >>> FlowPolicy(min_batch=8).min_batch
        8
    """

    predict: PredictFlow = Field(default_factory=PredictFlow)
    eval: EvalFlow = Field(default_factory=EvalFlow)
    train_loss: LossFlow = Field(default_factory=LossFlow)
    privacy: PrivacyBudget = Field(default_factory=PrivacyBudget)
    eval_splits: list[Literal["train", "test"]] = Field(default_factory=lambda: ["test"])
    min_batch: int | None = Field(None, ge=1)  # the fewest rows of a step, and distinct indices of an eval


@dataclass(frozen=True)
class FlowRequest:
    """One request, as the party about to execute it sees it (nothing here is taken on the caller's word except
    the split and the metric, which the party checks against its data).

    Args:
        op: the operation (``predict``, ``eval``, ``fetch``; others pass).
        caller: the pinned peer name; owner: this party's name.
        rows: rows in the batch; distinct: distinct indices in it (-1: the message has no indices).
        split: the data split (``"inputs"`` for caller-supplied inputs); metric: an evaluation's metric.
    """

    op: str
    caller: str
    owner: str
    rows: int
    distinct: int = -1
    split: str = ""
    metric: str = ""


@dataclass(frozen=True)
class Decision:
    """A yes/no with the reason that goes into the audit record."""

    allowed: bool
    reason: str


class Usage(Protocol):
    """Rows a caller has already used (the audit log implements it: ``AuditLog.rows``)."""

    def rows(self, ops: tuple[str, ...], caller: str | None = None, since: float | None = None) -> int: ...


class NoUsage:
    """A usage source with nothing used (for checks that do not count)."""

    def rows(self, ops: tuple[str, ...], caller: str | None = None, since: float | None = None) -> int:
        return 0


def receiver_of(flow: PredictFlow, owner: str) -> str:
    """The pinned name that may fetch results: ``result_receiver``, with ``"owner"`` meaning `owner` itself."""
    return owner if flow.result_receiver == OWNER else flow.result_receiver


def _budget(usage: Usage, op: str, req: FlowRequest, per_day: int | None, total: int | None, key: str,
            now: dt.datetime) -> Decision | None:
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0).timestamp()
    for limit, since, what, field in ((per_day, midnight, "today (UTC)", "max_rows_per_day"),
                                      (total, None, "in total", "max_rows_total")):
        if limit is None:
            continue
        used = usage.rows((op,), caller=req.caller, since=since)
        if used + req.rows > limit:
            return Decision(False, f"peer {req.caller!r} has used {used} of its {limit} {op} rows {what}; "
                                   f"{req.rows} more exceed policy.{key}.{field} (rows, counted from the audit log)")
    return None


def admit(flow: FlowPolicy, req: FlowRequest, usage: Usage, now: dt.datetime | None = None) -> Decision:
    """Whether `req` may run, and (for ``fetch``) whether its result may leave: rules 1-7 of the module docstring,
    in that order. Operations other than predict, eval and fetch pass (``"flow: not a flow operation"``).

    Args:
        flow: the party's :class:`FlowPolicy`.
        req: the request (:class:`FlowRequest`).
        usage: rows used so far (the audit log).
        now: an aware UTC datetime (default: now).

    Returns:
        A :class:`Decision`; its reason names the policy field that refused.

    Example:
        >>> flow = FlowPolicy(min_batch=8)
        >>> admit(flow, FlowRequest("eval", "alice", "bob", rows=8, distinct=1, split="test", metric="error"),
        ...       NoUsage()).reason[:37]
        'eval over 1 distinct indices (8 rows)'
    """
    now = now or dt.datetime.now(dt.UTC)
    if req.op == "predict":
        p = flow.predict
        if req.split not in p.splits:
            return Decision(False, f"prediction on the {req.split!r} split is not allowed (policy.predict.splits = "
                                   f"{p.splits}): predictions on training samples hand out their labels")
        refused = _budget(usage, "predict", req, p.max_rows_per_day, p.max_rows_total, "predict", now)
        return refused or Decision(True, "flow: predict within its row budgets")
    if req.op == "fetch":
        receiver = receiver_of(flow.predict, req.owner)
        if req.caller != receiver:
            return Decision(False, f"{req.caller!r} may not receive {req.owner}'s outputs: "
                                   f"policy.predict.result_receiver = {flow.predict.result_receiver!r}"
                                   + (f" ({req.owner} keeps its outputs)" if receiver == req.owner else ""))
        return Decision(True, f"flow: released to {receiver} as {flow.predict.form}")
    if req.op == "eval":
        if req.split not in flow.eval_splits:
            return Decision(False, f"evaluation on the {req.split!r} split is not allowed (policy.eval_splits = "
                                   f"{flow.eval_splits}): metrics on training labels would be a label oracle")
        if req.metric not in flow.eval.metrics:
            return Decision(False, f"metric {req.metric!r} is not allowed (policy.eval.metrics = "
                                   f"{flow.eval.metrics})")
        need = flow.min_batch or 1
        if req.distinct >= 0 and req.distinct < need:
            return Decision(False, f"eval over {req.distinct} distinct indices ({req.rows} rows) is below "
                                   f"policy.min_batch = {need} distinct indices: repeated rows make the sum a "
                                   "per-sample oracle")
        refused = _budget(usage, "eval", req, flow.eval.max_rows_per_day, flow.eval.max_rows_total, "eval", now)
        return refused or Decision(True, "flow: eval within its row budgets")
    return Decision(True, "flow: not a flow operation")


def distinct_count(idx: torch.Tensor) -> int:
    """The number of distinct indices in a batch (what ``min_batch`` counts)."""
    return int(torch.unique(idx).numel()) if idx.numel() else 0


class Release:
    """Turns the owner's logits into what may leave it (rule 4): ``release(logits) -> {name: tensor}``.

    ModelGuard-S is stateful (its centroids); give `state_path` to keep its state across restarts (a safetensors
    file in the owner's own folder, written after every release).

    Args:
        flow: the owner's :class:`PredictFlow`.
        state_path: where ModelGuard-S keeps its state (None: in memory only).

    Returns:
        ``release(logits)`` gives ``{"labels": int64}`` (label), ``{"topk": int64 [B, k]}`` (topk) or
        ``{"probs": float32 [B, K]}`` (probs and the ModelGuard forms), ``{"logits": float32 [B, K]}`` (logits).

    Example:
        >>> r = Release(PredictFlow(form="modelguard_w", epsilon=0.5))
        >>> out = r.release(torch.tensor([[2.0, 0.5, -1.0]]))
        >>> int(out["probs"].argmax()), bool(abs(float(out["probs"].sum()) - 1) < 1e-4)
        (0, True)
    """

    def __init__(self, flow: PredictFlow, state_path: str | Path | None = None) -> None:
        self.flow = flow
        self.state_path = Path(state_path) if state_path is not None else None
        self.defense = None
        if flow.form in ("modelguard_w", "modelguard_s"):

            self.defense = make_defense(flow.form, epsilon=flow.epsilon)
            if flow.form == "modelguard_s" and self.state_path is not None and self.state_path.is_file():
                self.defense.load(self.state_path)

    def release(self, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        if logits.dim() != 2:
            raise DataError(f"release: expected logits [batch, classes], got {list(logits.shape)}")
        form = self.flow.form
        if form == "logits":
            return {"logits": logits.float()}
        if form == "label":
            return {"labels": logits.argmax(1)}
        if form == "topk":
            k = min(self.flow.top_k, logits.shape[1])
            return {"topk": logits.topk(k, dim=1).indices}
        probs = torch.softmax(logits.double(), 1)
        if self.defense is None:
            return {"probs": probs.float()}
        out = self.defense.defend(probs).float()
        if self.flow.form == "modelguard_s" and self.state_path is not None:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            self.defense.save(self.state_path)
        return {"probs": out}


def as_labels(answer: dict[str, torch.Tensor]) -> torch.Tensor:
    """The predicted class of each row of a released answer, whatever its form."""
    if "labels" in answer:
        return answer["labels"]
    if "topk" in answer:
        return answer["topk"][:, 0]
    return answer["probs"].argmax(1)


def keep_outputs(folder: str | Path, session: str, token: str, logits: torch.Tensor,
                 index: torch.Tensor | None = None) -> Path:
    """The owner keeps a prediction's outputs (``result_receiver = "owner"``): ``predictions/<session>-<token>.csv``
    in its own folder (columns index, prediction, logit_0 …; the driver's ``predictions.csv`` format).

    Example:
        >>> import tempfile
        >>> keep_outputs(tempfile.mkdtemp(), "s1", "ab12", torch.zeros(2, 3)).name
        's1-ab12.csv'
    """

    index = torch.arange(len(logits)) if index is None else index
    cols = ["index", "prediction", *[f"logit_{k}" for k in range(logits.shape[1])]]
    rows = [dict(zip(cols, [int(i), int(p), *[f"{v:.6g}" for v in row]], strict=True))
            for i, p, row in zip(index.tolist(), logits.argmax(1).tolist(), logits.tolist(), strict=True)]
    safe = "".join(c for c in session if c.isalnum() or c in "-_")[:64] or "session"
    return write_csv(Path(folder) / "predictions" / f"{safe}-{token}.csv", rows, cols)


def role_warnings(name: str, prev: str | None, driver: str | None, is_first: bool) -> list[str]:
    """Start-up warnings for a party whose configuration gives one key two roles: the **data role** (sending this
    party activations, hence choosing its inputs) and the **control role** (the driver: fetching results,
    committing, restoring). Whoever holds both can query this party's part on inputs of its choice *and* collect
    the answers; separate identities (``driver = "operator"`` with its own certificate) keep them apart.

    Example:
        >>> role_warnings("bob", prev="alice", driver="alice", is_first=False)[0][:47]
        "party bob: 'alice' holds both the data role (it"
    """
    if is_first or prev is None or prev != driver:
        return []
    return [f"party {name}: {prev!r} holds both the data role (it sends this party activations) and the control "
            f"role (it is the driver: fetch, commit, restore); one key can then query this party's layers on "
            f"inputs of its choice and collect the answers. Give the driver its own identity (driver = "
            f"\"operator\" with its own certificate, [peers.operator]); docs/governance.md, 'Roles'"]


def request_fields(op: str, meta: dict, tensors: dict[str, torch.Tensor]) -> tuple[str, int, str]:
    """``(split, distinct indices, metric)`` of a data message, as :func:`admit` reads them: a prediction on inputs
    the caller sends is on the ``"inputs"`` split; an evaluation's split defaults to ``"train"`` (as the party reads
    it, so a caller that leaves it out is checked against the training split); ``distinct`` is -1 when the message
    carries no index vector.

    Example:
        >>> request_fields("eval", {"split": "test"}, {"idx": torch.tensor([3, 3, 3])})
        ('test', 1, 'error')
    """
    split = ""
    if op == "predict":
        split = "inputs" if "x" in tensors else str(meta.get("split", "test"))[:16]
    elif op == "eval":
        split = str(meta.get("split", "train"))[:16]
    idx = tensors.get("idx")
    distinct = distinct_count(idx) if idx is not None and idx.dim() == 1 and not idx.is_floating_point() else -1
    metric = str(meta.get("metric", "error"))[:32] if op == "eval" else "error"
    return split, distinct, metric
