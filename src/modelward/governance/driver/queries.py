"""What the driver asks of a trained split: evaluations (a noisy metric and the training loss of committed steps,
from the label holder's release path) and predictions (fetched from the label holder when its policy names the
driver as receiver).

An evaluation is sent in parts of at most ``batch_size`` rows (``meta.part = [i, k]``); the label holder sums the
parts and answers the total once, with the last part (one answer, charged once to the receiver's privacy budget),
together with the training loss of the steps committed since its previous answer. An answer the label holder
withholds (its receiver's budget is spent) scores NaN; training goes on.

Example:
    >>> error = evaluate(driver, "error", 1024)  # doctest: +SKIP
    >>> driver.train_loss  # {"mean": …, "steps": …, "rows": …} or None  # doctest: +SKIP
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import torch

from modelward.errors import ModelwardError
from modelward.governance.protocol import StepRolledBack
from modelward.governance.wire import Message


class OutputsKept(ModelwardError):
    """The label holder keeps a prediction's outputs (its policy): nothing was sent to the driver."""


class Chain(Protocol):
    """What the queries need of the coordinator."""

    names: list[str]
    status: dict[str, dict[str, Any]]
    uncommitted: int | None
    train_loss: dict[str, Any] | None
    withheld: str | None

    def call(self, party: str, op: str, step: int = 0, meta: dict | None = None,
             tensors: dict[str, torch.Tensor] | None = None) -> Message: ...

    def flush(self) -> None: ...


def evaluate(chain: Chain, metric: str = "error", batch_size: int = 1024) -> float:
    """Test loss like core.train.evaluate, computed along the chain (the label holder scores its labels).

    A step still to be committed is committed by the first request, along the chain as a step carries the commit
    of the one before (the state scored is the one every party voted for); if that request fails, the coordinator's
    ``flush`` settles the step (committed everywhere, or aborted everywhere) before the error is raised.

    Returns:
        The metric over the test split (NaN when the label holder withheld it: ``chain.withheld`` says why); the
        training loss it released with it is in ``chain.train_loss``.
    """
    n = int(chain.status[chain.names[0]]["n_test"])
    parts = max(1, math.ceil(n / batch_size))
    total: float | None = None
    chain.train_loss, chain.withheld = None, None
    for k, i in enumerate(range(0, n, batch_size)):
        idx = torch.arange(i, min(n, i + batch_size))
        meta: dict[str, Any] = {"split": "test", "metric": metric, "part": [k, parts]}
        carried = chain.uncommitted
        if carried is not None:
            meta["commit"] = carried
        try:
            r = chain.call(chain.names[0], "eval", 0, meta, {"idx": idx})
        except ModelwardError:
            if carried is not None:
                try:
                    chain.flush()  # vote and commit rounds (StepRolledBack, after aborting, if a party refused)
                except StepRolledBack:
                    raise
                except ModelwardError:
                    pass  # (a party is gone: the evaluation's own error is raised; resume_point settles it)
            raise
        chain.uncommitted = None
        if k == parts - 1:
            total = None if r.meta.get("sum") is None else float(r.meta["sum"])
            tl = r.meta.get("train_loss")
            chain.train_loss = tl if isinstance(tl, dict) else None
            chain.withheld = str(r.meta["withheld"]) if r.meta.get("withheld") else None
    return math.nan if total is None else total / n


def predict(chain: Chain, split: str = "test", x: torch.Tensor | None = None, batch_size: int = 256) -> torch.Tensor:
    """Predictions for the data owner's `split` (or for inputs `x`) through the whole chain; every party consents to
    inference, and the label holder releases them only as its policy says (``policy.predict``).

    Returns:
        By the label holder's ``form``: ``label`` int64 [N]; ``topk`` int64 [N, k]; ``probs`` and the ModelGuard
        forms: log-probabilities [N, K] (logits up to a constant). Raises :class:`OutputsKept` naming where they
        are when the label holder keeps its outputs (its default).
    """
    outs, kept = [], []
    first, last = chain.names[0], chain.names[-1]
    n = len(x) if x is not None else int(chain.status[first][f"n_{split}"])
    for i in range(0, n, batch_size):
        j = min(n, i + batch_size)
        t = {"x": x[i:j]} if x is not None else {"idx": torch.arange(i, j)}
        r = chain.call(first, "predict", 0, {"split": split}, t)
        if not r.meta.get("token"):
            kept.append(str(r.meta.get("kept", last)))
            continue
        answer = chain.call(last, "fetch", 0, {"token": r.meta["token"]}).tensors
        if "probs" in answer:
            outs.append(answer["probs"].clamp_min(1e-30).log())
        else:
            outs.append(answer.get("labels", answer.get("topk", answer.get("logits"))))
    if kept:
        raise OutputsKept(f"{last} keeps its outputs (its policy.predict.result_receiver is \"owner\"): "
                          f"{len(kept)} file(s), e.g. {kept[0]}")
    return torch.cat(outs)
