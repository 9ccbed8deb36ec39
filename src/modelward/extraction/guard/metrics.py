"""The guard's Prometheus metrics (issue 40 item 3): ``GET /metrics`` in the text exposition format, the convention of
every model server (KServe and Triton expose theirs the same way).

Counted as requests finish (no cost at scrape time): inference requests by status and code, refusals by reason,
answered rows, request latency and, in proxy mode, the upstream's latency (histograms). Read at scrape time from
the service: budget left per key with a budget, the detector's flags per key, the watermark's marked rows, and the
connection layer's open / authenticated connections, evictions and refusals.

The detector's flags and the budgets say something about every key, so ``/metrics`` asks for an operator key
(``Authorization: Bearer …``, as ``GET /v2/guard/status`` does) unless ``server.metrics_public = true`` (a port only
the cluster reaches). Each app has its own registry (several servers in one process do not collide).

Example:
    >>> m = GuardMetrics()
    >>> m.observe(200, "ok", 0.002, rows=16)
    >>> b"modelward_guard_requests_total" in m.render(None)
    True
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger("modelward.guard")

#: seconds; a guarded answer takes ~2–5 ms on a quiet CPU, a slow defense or a loaded store far more
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _StateCollector:
    """Gauges read from the service when scraped (budgets, detector flags, marks, connections)."""

    def __init__(self, owner: GuardMetrics) -> None:
        self.owner = owner

    def describe(self) -> list[Any]:
        return []  # collected lazily: the registry must not call collect() at registration

    def collect(self) -> Any:
        service, conn = self.owner.service, self.owner.connections
        if conn is not None:
            yield _gauge("modelward_guard_connections_open", "Open client connections.", conn().get("open", 0))
            yield _gauge("modelward_guard_connections_authenticated",
                         "Open connections that presented a valid API key.", conn().get("authenticated", 0))
            for name, help_ in (("evicted", "Idle or unauthenticated connections evicted at the connection limit."),
                                ("refused", "Connections refused with 503 too_many_connections.")):
                yield CounterMetricFamily(f"modelward_guard_connections_{name}", help_, value=conn().get(name, 0))
        if service is None:
            return
        budgets = self.owner.budgets()
        if budgets:
            used = _safe(lambda: service.log.usage(), {})
            g = GaugeMetricFamily("modelward_guard_budget_remaining_rows", "Rows a key may still query.",
                                  labels=["key"])
            for name, budget in sorted(budgets.items()):
                g.add_metric([name], max(0, budget - int(used.get(name, 0))))
            yield g
        status = _safe(service.status, {})
        det = (status or {}).get("detector") or {}
        if det:
            g = GaugeMetricFamily("modelward_guard_detector_flagged", "1 when the extraction detector flagged the key.",
                                  labels=["key"])
            flagged = 0
            for k in det.get("keys") or []:
                f = bool(k.get("flagged"))
                flagged += f
                g.add_metric([str(k.get("key", k.get("name", "?")))], 1.0 if f else 0.0)
            yield g
            yield _gauge("modelward_guard_detector_flagged_keys", "Keys the extraction detector flagged.", flagged)
        wm = (status or {}).get("watermark") or {}
        if wm:
            yield _gauge("modelward_guard_watermark_marked_rows", "Answer rows the watermark marked.",
                         wm.get("marked_rows", 0))


def _gauge(name: str, help_: str, value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, help_)
    g.add_metric([], float(value))
    return g


def _safe(fn: Callable[[], Any], default: Any) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001 - a scrape must not fail because the store is busy: the gauge is left out
        log.warning("guard: /metrics could not read the service's state", exc_info=True)
        return default


class GuardMetrics:
    """The metrics of one guard app.

    Args:
        service: the :class:`~modelward.extraction.guard.service.GuardService` read at scrape time (None: counters
            only).
    """

    def __init__(self, service: Any = None) -> None:
        self.service = service
        self.connections: Callable[[], Mapping[str, int]] | None = None  # set by serve(): the connection layer's
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.requests = Counter("modelward_guard_requests", "Inference requests by HTTP status and code.",
                                ["status", "code"], registry=r)
        self.refusals = Counter("modelward_guard_refusals", "Inference requests refused, by reason (the error code).",
                                ["reason"], registry=r)
        self.rows = Counter("modelward_guard_rows", "Rows answered (charged to a key's budget).", registry=r)
        self.latency = Histogram("modelward_guard_request_seconds", "Inference request latency (every outcome).",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.upstream = Histogram("modelward_guard_upstream_seconds", "Proxy mode: the model server's answer time.",
                                  buckets=LATENCY_BUCKETS, registry=r)
        r.register(_StateCollector(self))

    def budgets(self) -> dict[str, int]:
        """Every key with a budget (the config's and the operator-added ones), by name."""
        s = self.service
        out = {k.name: k.budget for k in getattr(s, "keys", {}).values() if k.budget is not None}
        out |= {k.name: k.budget for k in getattr(s, "_stored", {}).values() if k.budget is not None}
        return out

    def observe(self, status: int, code: str, seconds: float, rows: int = 0) -> None:
        """Count one finished inference request."""
        self.requests.labels(str(status), code).inc()
        if status != 200:
            self.refusals.labels(code).inc()
        elif rows:
            self.rows.inc(rows)
        self.latency.observe(seconds)

    def render(self, _request: Any = None) -> bytes:
        """The exposition text (``Content-Type`` :data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)


__all__ = ["CONTENT_TYPE", "GuardMetrics", "LATENCY_BUCKETS"]
