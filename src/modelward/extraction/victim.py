"""Victims an extraction attack queries: a local model behind a defense, or a guarded HTTP endpoint.

Both return *probabilities* (B×K) for a batch of inputs and count the queries they answered (the paper's query
budget, Sec. 2). The HTTP victim speaks the Open Inference Protocol (KServe v2) JSON dialect served by
``modelward guard serve`` (:mod:`modelward.extraction.guard`).
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from modelward.errors import DataError, ModelwardError
from modelward.extraction.defenses.base import NoDefense, PredictionDefense, l1_distortion


class VictimError(ModelwardError):
    """The victim rejected a query (bad request, authentication, unreachable server)."""


class QueryBudgetExceeded(VictimError):
    """The victim's query budget (local ``query_budget`` or the API key's budget on a server) is used up."""


@runtime_checkable
class Victim(Protocol):
    """What an extraction attack sees: a black box answering probability vectors."""

    num_classes: int
    queries_used: int

    def query(self, x: Tensor) -> Tensor:
        """Answer a batch of inputs with a B×K batch of (possibly perturbed) probabilities."""
        ...


class LocalVictim:
    """A local model + defense (the official code's ``Blackbox``): softmax of the logits, then the defense.

    Besides answering queries it records, for the harness, the largest and mean ℓ1 distortion of the answers
    (``max_l1``, ``mean_l1``) and offers :meth:`clean` — the undefended probabilities, not counted as queries —
    for fidelity and protected-accuracy measurements.

    Args:
        model: the victim classifier (returns logits).
        defense: the prediction-perturbation defense (default: none).
        batch_size: rows per forward pass.
        num_classes: K (default: read from the first answer).
        query_budget: the most queries it answers (None: unlimited); beyond it, :class:`QueryBudgetExceeded`.

    Returns:
        A victim; ``victim.query(x)`` returns the defended probability vectors and counts ``queries_used``.

    Example:
        >>> import torch
        >>> from modelward.extraction.defenses import ModelGuardS
        >>> victim = LocalVictim(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3)), ModelGuardS(0.5))
        >>> victim.query(torch.rand(6, 4)).shape, victim.queries_used
        (torch.Size([6, 3]), 6)
    """

    def __init__(self, model: nn.Module, defense: PredictionDefense | None = None, batch_size: int = 256,
                 num_classes: int | None = None, query_budget: int | None = None) -> None:
        if batch_size < 1:
            raise DataError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model.eval()
        self.defense = defense if defense is not None else NoDefense()
        self.batch_size = batch_size
        self.query_budget = query_budget
        self.queries_used = 0
        self.max_l1 = 0.0
        self._sum_l1 = 0.0
        self._num_classes = num_classes

    @property
    def num_classes(self) -> int:
        if self._num_classes is None:
            raise DataError("LocalVictim.num_classes is unknown until the first query; pass num_classes=")
        return self._num_classes

    @property
    def mean_l1(self) -> float:
        return self._sum_l1 / self.queries_used if self.queries_used else 0.0

    @torch.no_grad()
    def clean(self, x: Tensor) -> Tensor:
        """Undefended softmax probabilities (float32, B×K); not counted as queries, does not touch defense state."""
        outs = [torch.softmax(self.model(x[i:i + self.batch_size]).float(), dim=1)
                for i in range(0, x.shape[0], self.batch_size)]
        y = torch.cat(outs) if outs else torch.empty(0, self._num_classes or 0)
        if self._num_classes is None and y.numel():
            self._num_classes = y.shape[1]
        return y

    @torch.no_grad()
    def query(self, x: Tensor) -> Tensor:
        n = int(x.shape[0])
        if self.query_budget is not None and self.queries_used + n > self.query_budget:
            raise QueryBudgetExceeded(f"query budget of {self.query_budget} exhausted "
                                      f"({self.queries_used} used, {n} requested)")
        answers = []
        for i in range(0, n, self.batch_size):
            xb = x[i:i + self.batch_size]
            y = self.clean(xb)
            y_hat = self.defense.defend(y, xb) if self.defense.needs_inputs else self.defense.defend(y)
            d = l1_distortion(y, y_hat)
            self.max_l1 = max(self.max_l1, float(d.max()))
            self._sum_l1 += float(d.sum())
            self.queries_used += int(xb.shape[0])
            answers.append(y_hat.float())
        return torch.cat(answers) if answers else torch.empty(0, self.num_classes)


class HttpVictim:
    """A guarded prediction service reached over HTTP (KServe v2 JSON, ``modelward guard serve``).

    Batches larger than the server's ``max_batch_size`` (read from the model metadata) are split. HTTP 4xx answers
    become :class:`VictimError` with the server's message; an exhausted key budget becomes
    :class:`QueryBudgetExceeded`. ``queries_used`` counts the rows this client got answers for.

    Args:
        url: the service's base URL (``http://127.0.0.1:8080``).
        model_name: the served model's name.
        api_key: the client's key (sent as a bearer token).
        timeout: seconds per request.
        batch_size: rows per request (at most the server's ``max_batch_size``).

    Returns:
        A victim with the same ``query(x)`` / ``queries_used`` interface as :class:`LocalVictim`.

    Example:
        >>> victim = HttpVictim("http://127.0.0.1:8080", "digits", api_key="k1")  # doctest: +SKIP
        >>> probs = victim.query(x)  # doctest: +SKIP
    """

    def __init__(self, url: str, model_name: str, api_key: str | None = None, timeout: float = 30.0,
                 batch_size: int | None = None) -> None:
        import httpx

        self.url = url.rstrip("/")
        self.model_name = model_name
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        self.queries_used = 0
        meta = self._request("GET", f"/v2/models/{model_name}")
        try:
            self.num_classes = int(meta["outputs"][0]["shape"][-1])
            self.input_shape = tuple(int(d) for d in meta["inputs"][0]["shape"][1:])
            self.input_name = str(meta["inputs"][0]["name"])
            server_max = int(meta.get("parameters", {}).get("max_batch_size", 256))
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise VictimError(f"{self.url}: unexpected model metadata ({e!r}): {meta}") from None
        self.batch_size = min(batch_size or server_max, server_max)
        self.defense_name = meta.get("parameters", {}).get("defense")

    def _request(self, method: str, path: str, json: dict | None = None) -> dict:
        import httpx

        try:
            r = self._client.request(method, path, json=json)
        except httpx.HTTPError as e:
            raise VictimError(f"{self.url}{path}: request failed: {e}") from None
        try:
            body = r.json()
        except ValueError:
            body = {"error": r.text[:200]}
        if r.status_code == 429 and body.get("code") == "query_budget_exceeded":
            raise QueryBudgetExceeded(f"{self.url}: {body.get('error')}")
        if r.status_code >= 400:
            raise VictimError(f"{self.url}{path}: HTTP {r.status_code}: {body.get('error', body)}")
        return body

    def query(self, x: Tensor) -> Tensor:
        x = x.detach().to(torch.float32).cpu()
        if tuple(x.shape[1:]) != self.input_shape:
            raise DataError(f"inputs have shape {list(x.shape[1:])} per row; the victim expects "
                            f"{list(self.input_shape)}")
        answers = []
        for i in range(0, x.shape[0], self.batch_size):
            xb = x[i:i + self.batch_size]
            payload = {"inputs": [{"name": self.input_name, "shape": list(xb.shape), "datatype": "FP32",
                                   "data": xb.flatten().tolist()}]}
            body = self._request("POST", f"/v2/models/{self.model_name}/infer", json=payload)
            try:
                out = body["outputs"][0]
                probs = torch.tensor(out["data"], dtype=torch.float32).reshape(out["shape"])
            except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as e:
                raise VictimError(f"{self.url}: malformed inference response ({e!r})") from None
            if probs.shape != (xb.shape[0], self.num_classes) or not math.isfinite(float(probs.sum())):
                raise VictimError(f"{self.url}: response shape {list(probs.shape)} does not match the request")
            self.queries_used += int(xb.shape[0])
            answers.append(probs)
        return torch.cat(answers) if answers else torch.empty(0, self.num_classes)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> HttpVictim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
