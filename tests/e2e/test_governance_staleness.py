"""Bounded-staleness pipelining across real party processes (issue #27 item 3): a party killed with steps in
flight (kill -9, restarted from its checkpoints) costs no step and repeats none, and the audit logs verify."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from modelward.core.data import DataConfig, load_data
from modelward.core.init import init_model_
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig, build_model
from modelward.governance.audit import verify
from modelward.governance.demo import prepare_local_split
from modelward.governance.driver import SplitDriver
from modelward.governance.transport.launch import start_party


@pytest.mark.slow
def test_kill9_of_the_label_holder_mid_pipeline_resumes_without_losing_or_repeating_a_step(tmp_path: Path) -> None:
    data = load_data(DataConfig(source="digits", seed=0))
    model = init_model_(build_model(ModelConfig(arch="cnn", channels=[8, 16], fc=32), (1, 8, 8), 10), seed=0)
    split = prepare_local_split(tmp_path, model, data, ["alice", "bob"], ["conv1"], threads=1, checkpoint_every=5)
    split.start()
    tc = TrainConfig(steps=20, eval_every=20, batch_size=32, eval_batch_size=512, lr=0.05, momentum=0.9)
    restarted: dict = {}

    def on_step(step, loss, links):
        if step == 12 and not restarted:  # bob's checkpoints: 10; steps 12.. are in flight or prepared
            bob = split.processes["bob"]
            bob.kill()
            restarted["t"] = threading.Thread(target=lambda: restarted.setdefault("p", start_party(
                split.party_configs["bob"], bob.log, [f"port={bob.port}"])))
            restarted["t"].start()

    try:
        cfg = split.split_config(tc, seed=3, retry_s=60.0, timeout_s=20.0, staleness=1)
        with SplitDriver(cfg) as drv:
            res = drv.train(on_step=on_step, out_dir=tmp_path / "driver")
            ckpts = drv.checkpoint_all()
        restarted["t"].join()
        split.processes["bob"] = restarted["p"]
    finally:
        split.stop()
    assert res.resumes >= 1 and res.steps_run == tc.steps
    rows = (tmp_path / "driver/steps.csv").read_text().splitlines()[1:]
    assert [int(r.split(",")[0]) for r in rows] == list(range(tc.steps))  # none lost, none twice
    assert {m["step"] for m in ckpts.values()} == {tc.steps}
    assert res.curve[-1][1] < res.curve[0][1]
    for n in ("alice", "bob"):
        assert verify(tmp_path / n / "audit.db").ok, n
