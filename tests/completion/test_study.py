"""The completion study on the core runner: your own nn.Module in process, the plan's dependencies, progress."""

import pytest
import torch

from modelward.completion.config import StudyConfig
from modelward.completion.plan import orig_id, plan
from modelward.completion.study import run_study
from modelward.completion.supervised import ModuleProblem
from modelward.core.data import DataConfig, load_data
from modelward.core.ledger import RunLedger
from modelward.core.progress import RecordingProgress
from modelward.core.train import TrainConfig


class TwoLayer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.flat = torch.nn.Flatten()
        self.hidden = torch.nn.Linear(4, 8)
        self.out = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(self.flat(x))))


@pytest.fixture(scope="module")
def problem() -> ModuleProblem:
    data = load_data(DataConfig(source="iris"))
    return ModuleProblem(TwoLayer(), data, TrainConfig(steps=40, eval_every=5, lr=0.1, batch_size=16))


def test_plan_makes_every_retraining_depend_on_its_original(problem) -> None:
    cfg = StudyConfig(seeds=[0, 1], parts=["hidden", "out"])
    runs = plan(cfg, problem)
    assert len(runs) == 2 * (1 + 2 * 2 + 1)  # + the from-scratch reference T0, once per seed
    assert sum(r.spec.get("procedure") == "T0" for r in runs) == 2
    assert len(plan(StudyConfig(seeds=[0, 1], parts=["hidden"], reference_seeds=[1]), problem)) == 2 * 3 + 1
    assert len(plan(StudyConfig(seeds=[0, 1], parts=["hidden"], reference=False), problem)) == 2 * 3
    for r in runs:
        assert r.depends_on == (() if r.spec["kind"] == "orig" else (orig_id("", r.spec["seed"]),))


def test_run_study_with_your_own_module(tmp_path, problem) -> None:
    cfg = StudyConfig(seeds=[0], parts=["hidden", "out"], alphas=[0.5, 1.0],
                      procedures=[{"name": "T1", "kind": "T1"}])
    rec = RecordingProgress()
    outcome = run_study(cfg, tmp_path, progress=rec, problem=problem)
    assert (outcome.done, outcome.total, outcome.failed) == (4, 4, {})  # + T0
    assert rec.completed("study study") == 4 and "MC(α=1)" in rec.events[-2][3]
    assert [r["part"] for r in outcome.tables.inf_rows] == ["hidden", "hidden", "out", "out"]
    assert [r["part"] for r in outcome.tables.rows][:2] == ["(all)", "(all)"]  # the T0 reference rows
    parts = (tmp_path / "parts.csv").read_text().splitlines()
    assert parts[1:] == ["hidden,40,40", "out,27,27", "total,67,"]  # counted on the user's module
    assert {"hardness.csv", "hardness.md", "hardness.json", "hardness_T1.png"} <= {p.name for p in tmp_path.iterdir()}
    # a resume re-executes nothing and gives the same table
    before = (tmp_path / "hardness.csv").read_bytes()
    again = run_study(cfg, tmp_path, problem=problem)
    assert again.done == 4 and (tmp_path / "hardness.csv").read_bytes() == before
    assert RunLedger(tmp_path / "ledger.sqlite").counts()["done"] == 4
