"""Per-client extraction detection on the query stream (PRADA: Juuti, Szyller, Marchal & Asokan, "PRADA:
Protecting Against DNN Model Stealing Attacks", EuroS&P 2019, Algorithm 1).

For each client, PRADA keeps a *growing set* G_c of past queries per predicted class c. A new query x predicted as
c contributes its minimum ℓ2 distance to G_c, d_min, to the client's distance set D; x joins G_c when d_min exceeds
the class threshold T_c = max(T_c, mean(D_c) − std(D_c)) over the distances D_c that admitted G_c's members.
Natural queries give a roughly normal D; synthetic queries (JBDA and its variants perturb earlier queries by
small steps) give a D with a spike of small distances. Once |D| ≥ ``min_queries``, the Shapiro–Wilk statistic W
of D is compared with δ: W < δ flags the client.

The state is a plain event list (class, d_min, admitted, vector) so a service can persist it row by row and replay
it after a crash; :meth:`PradaDetector.replay` rebuilds exactly the same state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.stats import shapiro
from torch import Tensor

from modelward.errors import ConfigError

MAX_SHAPIRO = 5000  # scipy's Shapiro–Wilk p-value is exact up to 5,000 samples; W uses the latest ones


@dataclass(frozen=True)
class PradaEvent:
    """One observed query: its predicted class, its d_min (NaN for the first of its class), whether it joined G,
    and whether it closed a batch (the test runs once per batch)."""

    cls: int
    d_min: float
    admitted: bool
    vector: np.ndarray | None  # kept only when admitted
    batch_end: bool = False


@dataclass
class _ClientState:
    growing: dict[int, list[np.ndarray]] = field(default_factory=dict)
    admitted_d: dict[int, list[float]] = field(default_factory=dict)
    threshold: dict[int, float] = field(default_factory=dict)
    distances: list[float] = field(default_factory=list)
    queries: int = 0
    flagged_at: int | None = None
    last_w: float | None = None
    tested_at: int = 0  # |D| at the last test


@dataclass(frozen=True)
class DetectorVerdict:
    """The detector's view of one client after a batch.

    Args:
        flagged: W < δ (now or earlier: a flag is sticky).
        shapiro_w: the latest W (None before ``min_queries``).
        queries: queries observed from this client.
        flagged_at: the query count at which it was first flagged.
    """

    flagged: bool
    shapiro_w: float | None
    queries: int
    flagged_at: int | None


class PradaDetector:
    """PRADA (Algorithm 1) over many clients.

    Args:
        delta: the Shapiro–Wilk threshold δ (flag when W < δ).
        min_queries: distances needed before testing (PRADA starts at 100).
        max_growing: most stored queries per client (oldest classes keep theirs; new ones stop joining).

    Returns:
        ``observe(client, x, predicted)`` → (:class:`DetectorVerdict`, the events to persist);
        ``verdict(client)``; ``replay(client, events)``.

    Example:
        >>> import torch
        >>> det = PradaDetector(delta=0.9, min_queries=20)
        >>> v, _ = det.observe("alice", torch.rand(50, 8), torch.randint(0, 3, (50,)))
        >>> v.queries
        50
    """

    def __init__(self, delta: float = 0.9, min_queries: int = 100, max_growing: int = 5000) -> None:
        if not 0.0 < delta < 1.0:
            raise ConfigError(f"detector delta: must be in (0, 1), got {delta}")
        if min_queries < 3:
            raise ConfigError(f"detector min_queries: must be >= 3 (Shapiro–Wilk), got {min_queries}")
        self.delta, self.min_queries, self.max_growing = float(delta), int(min_queries), int(max_growing)
        self._clients: dict[str, _ClientState] = {}

    def clients(self) -> list[str]:
        return sorted(self._clients)

    def _state(self, client: str) -> _ClientState:
        return self._clients.setdefault(client, _ClientState())

    def _step(self, st: _ClientState, cls: int, v: np.ndarray) -> PradaEvent:
        grown = st.growing.setdefault(cls, [])
        st.queries += 1
        if not grown:
            grown.append(v)
            st.admitted_d.setdefault(cls, [])
            st.threshold.setdefault(cls, 0.0)
            return PradaEvent(cls, math.nan, True, v)
        d_min = float(np.sqrt(((np.stack(grown) - v) ** 2).sum(1)).min())
        st.distances.append(d_min)
        admitted = d_min > st.threshold[cls] and sum(len(g) for g in st.growing.values()) < self.max_growing
        if admitted:
            grown.append(v)
            dc = st.admitted_d[cls]
            dc.append(d_min)
            st.threshold[cls] = max(st.threshold[cls], float(np.mean(dc) - np.std(dc)))
        return PradaEvent(cls, d_min, admitted, v if admitted else None)

    def _test(self, st: _ClientState) -> None:
        n = len(st.distances)
        # the test costs O(|D| log |D|): it runs once |D| has grown by 2 % since the last one (every new distance
        # while |D| < 50), so a client sending one row per request does not pay a full test per request
        if n < self.min_queries or n - st.tested_at < max(1, n // 50):
            return
        st.tested_at = n
        d = np.asarray(st.distances[-MAX_SHAPIRO:])
        w = 1.0 if np.ptp(d) == 0 else float(shapiro(d).statistic)
        st.last_w = w
        if w < self.delta and st.flagged_at is None:
            st.flagged_at = st.queries

    def observe(self, client: str, x: Tensor, predicted: Tensor) -> tuple[DetectorVerdict, list[PradaEvent]]:
        """Feed one batch of a client's queries (in arrival order) with the model's top-1 for each."""
        st = self._state(client)
        rows = x.detach().to("cpu", torch.float32).reshape(len(x), -1).numpy()
        events = [self._step(st, int(c), rows[i].copy()) for i, c in enumerate(predicted.tolist())]
        if events:
            last = events[-1]
            events[-1] = PradaEvent(last.cls, last.d_min, last.admitted, last.vector, batch_end=True)
        self._test(st)
        return self.verdict(client), events

    def replay(self, client: str, events: list[PradaEvent]) -> None:
        """Rebuild a client's state from its persisted events (same order as observed)."""
        st = self._state(client)
        for e in events:
            st.queries += 1
            grown = st.growing.setdefault(e.cls, [])
            st.admitted_d.setdefault(e.cls, [])
            st.threshold.setdefault(e.cls, 0.0)
            if not math.isnan(e.d_min):
                st.distances.append(e.d_min)
            if e.admitted and e.vector is not None:
                grown.append(e.vector)
                if not math.isnan(e.d_min):
                    dc = st.admitted_d[e.cls]
                    dc.append(e.d_min)
                    st.threshold[e.cls] = max(st.threshold[e.cls], float(np.mean(dc) - np.std(dc)))
            if e.batch_end:
                self._test(st)

    def verdict(self, client: str) -> DetectorVerdict:
        st = self._clients.get(client) or _ClientState()
        return DetectorVerdict(st.flagged_at is not None, st.last_w, st.queries, st.flagged_at)
