"""A finished original whose checkpoint is damaged is re-created, not blamed on every re-run (issue 31 item 8)."""

from __future__ import annotations

import torch

from modelward.completion.config import StudyConfig
from modelward.completion.plan import orig_id
from modelward.completion.study import run_study
from modelward.completion.supervised import ModuleProblem
from modelward.core.data import DataConfig, load_data
from modelward.core.ledger import RunLedger
from modelward.core.train import TrainConfig


def test_a_damaged_original_checkpoint_is_recreated_and_the_study_completes_as_before(tmp_path) -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    problem = ModuleProblem(net, load_data(DataConfig(source="iris")),
                            TrainConfig(steps=30, eval_every=5, lr=0.1, batch_size=16))
    cfg = StudyConfig(seeds=[0], parts=["1", "3"], alphas=[0.5, 1.0], procedures=[{"name": "T1", "kind": "T1"}],
                      reference=False)
    first = run_study(cfg, tmp_path, problem=problem)
    assert first.done == first.total and first.failed == {}
    before = (tmp_path / "hardness.csv").read_bytes()
    ledger = RunLedger(tmp_path / "ledger.sqlite")
    retrain = next(r for r in ledger.results() if r.startswith("re|"))
    ledger.reopen(retrain)  # as if that retraining had been interrupted
    ckpts = list((tmp_path / "checkpoints").glob("original_seed0*.safetensors"))
    assert ckpts
    for c in ckpts:
        c.write_bytes(b"\0" * 64)  # the finished original's checkpoint is damaged
    again = run_study(cfg, tmp_path, problem=problem)
    assert again.done == again.total and again.failed == {}, again.failed
    assert ledger.status(orig_id("", 0)) == "done"
    assert (tmp_path / "hardness.csv").read_bytes() == before  # the same original again, the same table
