"""The guard's Prometheus metrics read from a real service (issue 40 item 3): the detector's flag per key and the
watermark's marked rows appear as gauges; counters follow what was observed. (Over HTTP, with the operator-key
check: tests/e2e/test_guard_operations.py.)"""

from __future__ import annotations

import torch
from prometheus_client.parser import text_string_to_metric_families

from modelward.core.zoo import ModelConfig, build_model
from modelward.extraction.guard.metrics import GuardMetrics
from modelward.extraction.guard.process import write_guard_config
from modelward.extraction.guard.service import build_service

SHAPE, K = (1, 4, 4), 5


def _samples(text: bytes) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text.decode()) for s in fam.samples}


def test_detector_flags_marks_and_budgets_are_scraped_from_the_service(tmp_path):
    cfg = ModelConfig(arch="mlp", hidden=[8])
    torch.manual_seed(0)
    path = write_guard_config(tmp_path, build_model(cfg, SHAPE, K), cfg, SHAPE, K, keys={"metrics-key-0": 50},
                              name="tiny", ownership={"watermark": {"enabled": True},
                                                      "detector": {"enabled": True, "min_queries": 3,
                                                                   "delta": 0.999}})
    svc = build_service(path)
    try:
        key = svc.keys["metrics-key-0"]
        # one query per request: PRADA needs a stream; 12 near-identical points are far from natural data
        for i in range(12):
            svc.answer(key, torch.full((1, *SHAPE), 0.5) + 1e-3 * i)
        m = GuardMetrics(svc)
        m.observe(200, "ok", 0.003, rows=12)
        m.observe(429, "query_budget_exceeded", 0.001)
        got = _samples(m.render())
    finally:
        svc.close()
    assert got[("modelward_guard_budget_remaining_rows", (("key", "key0"),))] == 50 - 12
    flag = got[("modelward_guard_detector_flagged", (("key", "key0"),))]
    assert flag in (0.0, 1.0) and got[("modelward_guard_detector_flagged_keys", ())] == flag
    assert ("modelward_guard_watermark_marked_rows", ()) in got
    assert got[("modelward_guard_refusals_total", (("reason", "query_budget_exceeded"),))] == 1
    assert got[("modelward_guard_rows_total", ())] == 12
    assert got[("modelward_guard_request_seconds_bucket", (("le", "0.005"),))] == 2
