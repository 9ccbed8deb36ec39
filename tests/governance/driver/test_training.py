"""The training loop reports to a ProgressSink and keeps its outputs in files a resumed run reads back."""

from __future__ import annotations

import csv
import json

from modelward.core.progress import RecordingProgress
from modelward.core.train import TrainConfig
from modelward.governance.driver.training import PROGRESS_KEY


def test_train_reports_every_step_to_the_sink_and_writes_curve_and_steps(make_chain, tmp_path):
    c = make_chain()
    tc = TrainConfig(steps=5, eval_every=2, batch_size=16, eval_batch_size=128, lr=0.05)
    progress = RecordingProgress()
    out = tmp_path / "driver"
    with c.driver(tc, seed=1) as drv:
        res = drv.train(progress, out)
    kinds = [e[0] for e in progress.events]
    assert kinds[0] == "start" and progress.events[0][2] == tc.steps and kinds[-1] == "done"
    assert progress.completed(PROGRESS_KEY) == tc.steps == res.steps_run
    assert any(e[0] == "advance" and e[3].startswith("loss ") for e in progress.events)
    assert progress.events[-1][3] == f"test {tc.loss} {res.curve[-1][1]:.4f}"
    assert [tuple(x) for x in json.loads((out / "curve.json").read_text())] == res.curve
    assert [s for s, _ in res.curve] == [0, 2, 4, 5]
    with (out / "steps.csv").open() as f:
        assert [int(r["step"]) for r in csv.DictReader(f)] == list(range(tc.steps))
    assert not list(out.glob("*.tmp"))  # written atomically: no temporary file left behind


def test_a_second_run_resumes_from_the_parties_and_the_files(make_chain, tmp_path):
    c = make_chain()
    out = tmp_path / "driver"
    first = TrainConfig(steps=3, eval_every=3, batch_size=16, eval_batch_size=128, lr=0.05)
    with c.driver(first, seed=1, session="s") as drv:
        drv.train(None, out)
    progress = RecordingProgress()
    with c.driver(first.model_copy(update={"steps": 5}), seed=1, session="s") as drv:
        res = drv.train(progress, out)
    assert [s for s, _ in res.curve] == [0, 3, 5]  # the curve up to step 3 comes from curve.json
    assert progress.completed(PROGRESS_KEY) == 5 and progress.events[1][2] == 3  # it starts at step 3
