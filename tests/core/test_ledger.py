"""Training procedure T (curve semantics, T2 freezing), the run ledger, safetensors io."""

from __future__ import annotations

from modelward.core.ledger import RunLedger


def test_ledger_finish_is_idempotent_and_recover(tmp_path):
    led = RunLedger(tmp_path / "l.sqlite")
    led.add("a", {"x": 1})
    led.add("a", {"x": 1})
    assert led.start("a") and not led.start("a")
    assert led.recover() == 1 and led.pending() == ["a"]
    assert led.start("a") and led.finish("a", {"r": 1}) and not led.finish("a", {"r": 2})
    assert led.results() == {"a": {"r": 1}} and led.counts()["done"] == 1
