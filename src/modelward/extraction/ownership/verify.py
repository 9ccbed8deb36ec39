"""Ownership verification of a suspect model: does it carry this guard's answer watermark, or this model's
boundary fingerprint? Each test returns its own p-value and the number of queries it spent.

The suspect is a local model (:class:`LocalSuspect`) or any Open Inference Protocol endpoint
(:class:`HttpSuspect`) answering scores (B × K) or labels (B). The watermark test uses the rows the guard marked
(:class:`WatermarkRecords`, kept in the guard's state) and the statistics of
:mod:`modelward.extraction.ownership.watermark`; the fingerprint test uses
:class:`~modelward.extraction.ownership.fingerprint.Fingerprint`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from modelward.core.device import model_device
from modelward.errors import DataError
from modelward.extraction.ownership.fingerprint import Fingerprint
from modelward.extraction.ownership.watermark import watermark_p_value


@runtime_checkable
class Suspect(Protocol):
    """A model under suspicion: answers scores (B × K) when it exposes them, else labels (B)."""

    queries_used: int

    def answer(self, x: Tensor) -> tuple[Tensor | None, Tensor]:
        """(scores or None, top-1 labels) for a batch."""
        ...


class LocalSuspect:
    """A suspect checkpoint loaded locally (its logits are its scores).

    Args:
        model: the suspect classifier.
        batch_size: rows per forward pass.
        labels_only: pretend only labels are visible (tests the label-only statistic).
    """

    def __init__(self, model: nn.Module, batch_size: int = 512, labels_only: bool = False) -> None:
        self.model, self.batch_size, self.labels_only = model.eval(), batch_size, labels_only
        self.queries_used = 0

    @torch.no_grad()
    def answer(self, x: Tensor) -> tuple[Tensor | None, Tensor]:
        dev = model_device(self.model)
        z = torch.cat([self.model(x[i : i + self.batch_size].to(dev)).float().cpu()
                       for i in range(0, len(x), self.batch_size)])
        self.queries_used += len(x)
        return (None if self.labels_only else z), z.argmax(1)


class HttpSuspect:
    """A suspect behind any Open Inference Protocol (KServe v2) REST endpoint.

    The first output of the answer is read: a [B, K] float tensor is taken as scores, a [B] or [B, 1] integer
    tensor as labels.

    Args:
        url: base URL (``http://host:port``).
        model_name: the model's name on that server.
        api_key: optional bearer token.
        batch_size: rows per request.
        timeout: seconds per request.
    """

    def __init__(self, url: str, model_name: str, api_key: str | None = None, batch_size: int = 64,
                 timeout: float = 30.0) -> None:
        import httpx

        self.url, self.model_name, self.batch_size = url.rstrip("/"), model_name, batch_size
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        self.queries_used = 0
        try:
            meta = self._client.get(f"/v2/models/{model_name}").json()
            self.input_name = str(meta["inputs"][0]["name"])
        except Exception as exc:  # noqa: BLE001 - any failure here means "not an OIP model endpoint"
            raise DataError(f"{self.url}: no OIP model {model_name!r} there ({exc})") from None

    def answer(self, x: Tensor) -> tuple[Tensor | None, Tensor]:
        import httpx

        x = x.detach().float().cpu()
        scores: list[Tensor] = []
        labels: list[Tensor] = []
        for i in range(0, len(x), self.batch_size):
            xb = x[i : i + self.batch_size]
            payload = {"inputs": [{"name": self.input_name, "shape": list(xb.shape), "datatype": "FP32",
                                   "data": xb.flatten().tolist()}]}
            try:
                r = self._client.post(f"/v2/models/{self.model_name}/infer", json=payload)
                body = r.json()
            except (httpx.HTTPError, ValueError) as exc:
                raise DataError(f"{self.url}: inference request failed ({exc})") from None
            if r.status_code >= 400:
                raise DataError(f"{self.url}: HTTP {r.status_code}: {body.get('error', body)}")
            try:
                out = body["outputs"][0]
                t = torch.tensor(out["data"]).reshape(out["shape"])
            except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as exc:
                raise DataError(f"{self.url}: malformed inference response ({exc!r})") from None
            if t.dim() == 2 and t.shape[1] > 1 and t.shape[0] == len(xb):
                scores.append(t.float())
                labels.append(t.argmax(1))
            elif t.numel() == len(xb):
                labels.append(t.reshape(-1).long())
            else:
                raise DataError(f"{self.url}: answer of shape {list(t.shape)} for {len(xb)} rows")
            self.queries_used += len(xb)
        lab = torch.cat(labels) if labels else torch.empty(0, dtype=torch.long)
        return (torch.cat(scores) if scores and len(scores) == len(labels) else None), lab

    def close(self) -> None:
        self._client.close()


@dataclass(frozen=True)
class WatermarkRecords:
    """The distinct rows a guard marked: the query, its keyed class w and the owner's top-1 t there."""

    x: Tensor
    marks: Tensor
    top1: Tensor
    num_classes: int

    def __len__(self) -> int:
        return len(self.x)


@dataclass(frozen=True)
class Evidence:
    """One test's outcome.

    Args:
        method: "watermark" or "fingerprint".
        statistic: what a match is ("top1", "rank among non-top", "agreement").
        matches, n: matches over rows tested.
        p_value: the test's p-value ("derived from this model" is rejected for p above the chosen level).
        queries: suspect queries this test spent.
        null: the null rate or distribution in words.
    """

    method: str
    statistic: str
    matches: int
    n: int
    p_value: float
    queries: int
    null: str

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def verify_watermark(suspect: Suspect, records: WatermarkRecords, max_rows: int | None = None) -> Evidence:
    """Test the suspect on the marked rows (see :mod:`.watermark` for the two statistics and their nulls).

    Args:
        suspect: the suspect.
        records: the guard's marked rows.
        max_rows: query at most this many rows (the first ones; None: all).

    Returns:
        :class:`Evidence` with a binomial p-value.
    """
    k = records.num_classes
    n = len(records) if max_rows is None else min(len(records), max_rows)
    if n == 0:
        return Evidence("watermark", "none", 0, 0, 1.0, 0, "no marked rows recorded yet")
    q0 = suspect.queries_used
    scores, labels = suspect.answer(records.x[:n])
    marks, top = records.marks[:n], records.top1[:n]
    if scores is not None and scores.shape[1] == k:
        others = scores.clone().float()
        others[torch.arange(n), top] = -math.inf
        best = others.max(1)
        w_score = others.gather(1, marks[:, None]).squeeze(1)
        strictly = (others == best.values[:, None]).sum(1) == 1  # a tie counts as no match
        match = (w_score == best.values) & strictly
        stat = "keyed class ranked first among the classes other than the owner's top-1"
    else:
        match = labels == marks
        stat = "top-1 equals the keyed class"
    m = int(match.sum())
    return Evidence("watermark", stat, m, n, watermark_p_value(m, n, k), suspect.queries_used - q0,
                    f"Binomial(n, 1/{k - 1})")


def verify_fingerprint(suspect: Suspect, fingerprint: Fingerprint) -> Evidence:
    """Test the suspect's agreement with the owner's labels on the fingerprint inputs (beta-binomial null)."""
    q0 = suspect.queries_used
    _, labels = suspect.answer(fingerprint.x)
    m = int((labels == fingerprint.labels).sum())
    refs = fingerprint.reference_agreement
    return Evidence("fingerprint", "agreement with the owner's label", m, len(fingerprint), fingerprint.p_value(m),
                    suspect.queries_used - q0,
                    f"BetaBinomial(n, {fingerprint.null_alpha:.3g}, {fingerprint.null_beta:.3g}); references agreed "
                    f"{min(refs):.2f}–{max(refs):.2f}")


@dataclass(frozen=True)
class OwnershipReport:
    """Both tests and the decision at a level (Bonferroni over the tests that ran)."""

    evidence: list[Evidence]
    level: float

    @property
    def p_value(self) -> float:
        ran = [e for e in self.evidence if e.n > 0]
        return min(1.0, min((e.p_value for e in ran), default=1.0) * max(len(ran), 1))

    @property
    def derived(self) -> bool:
        return self.p_value < self.level

    @property
    def queries(self) -> int:
        return sum(e.queries for e in self.evidence)

    def to_dict(self) -> dict[str, object]:
        return {"derived": self.derived, "p_value": self.p_value, "level": self.level, "queries": self.queries,
                "evidence": [e.to_dict() for e in self.evidence]}


def verify_ownership(suspect: Suspect, *, watermark: WatermarkRecords | None = None,
                     fingerprint: Fingerprint | None = None, level: float = 1e-6,
                     max_watermark_rows: int | None = None) -> OwnershipReport:
    """Run the watermark and/or fingerprint tests on a suspect.

    Args:
        suspect: a :class:`LocalSuspect` or :class:`HttpSuspect`.
        watermark: the guard's marked rows (None: skip).
        fingerprint: the owner's fingerprint (None: skip).
        level: the decision level for "derived from this model" (on the Bonferroni-combined p-value).
        max_watermark_rows: cap on the watermark rows queried.

    Returns:
        An :class:`OwnershipReport`.

    Example:
        >>> import torch
        >>> from modelward.extraction.ownership import AnswerWatermark
        >>> owner = torch.nn.Linear(4, 3)
        >>> x = torch.rand(8, 4)
        >>> t = owner(x).argmax(1)
        >>> recs = WatermarkRecords(x, AnswerWatermark(b"k" * 32).marks(x, t, 3), t, 3)
        >>> verify_ownership(LocalSuspect(torch.nn.Linear(4, 3)), watermark=recs).evidence[0].n
        8
    """
    if watermark is None and fingerprint is None:
        raise DataError("verify_ownership: give a watermark record set, a fingerprint, or both")
    ev: list[Evidence] = []
    if watermark is not None:
        ev.append(verify_watermark(suspect, watermark, max_watermark_rows))
    if fingerprint is not None:
        ev.append(verify_fingerprint(suspect, fingerprint))
    return OwnershipReport(ev, level)
