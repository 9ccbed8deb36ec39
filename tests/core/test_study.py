"""core.study: one frame for every study; the one resume rule (only execution settings may change)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest

from modelward.core.config import StrictModel
from modelward.core.runner import Execute, RunOutcome, RunSpec
from modelward.core.study import EXECUTION_SETTINGS, Study, StudyContext, config_fingerprint, run_study
from modelward.errors import LedgerError


class PowersConfig(StrictModel):
    numbers: list[int] = [1, 2, 3]
    power: int = 2
    device: str = "cpu"
    threads: int = 1


def power(run_id: str, spec: dict[str, Any], deps: dict[str, dict[str, Any]]) -> dict[str, Any]:
    if spec["n"] < 0:
        raise ValueError("negative")
    return {"value": spec["n"] ** spec["p"]}


class Powers(Study[PowersConfig, list[int]]):
    name = "powers"
    config_model = PowersConfig
    executed: ClassVar[list[str]] = []

    def plan(self, cfg: PowersConfig, ctx: StudyContext) -> list[RunSpec]:
        return [RunSpec(f"p|{n}", {"n": n, "p": cfg.power}) for n in cfg.numbers]

    def execute(self, cfg: PowersConfig, ctx: StudyContext) -> Execute:
        def run(run_id: str, spec: dict[str, Any], deps: dict[str, dict[str, Any]]) -> dict[str, Any]:
            self.executed.append(run_id)
            return power(run_id, spec, deps)

        return run

    def summarize(self, cfg: PowersConfig, ctx: StudyContext, outcome: RunOutcome) -> list[int]:
        res = ctx.ledger.results()
        return [res[f"p|{n}"]["value"] for n in cfg.numbers if f"p|{n}" in res]


def test_a_study_runs_resumes_on_another_device_and_refuses_another_config(tmp_path: Path) -> None:
    Powers.executed.clear()
    assert run_study(Powers(), PowersConfig(), tmp_path) == [1, 4, 9]
    assert (tmp_path / "config.json").is_file() and (tmp_path / "ledger.sqlite").is_file()
    # execution settings may change on resume; nothing runs twice
    again = run_study(Powers(), PowersConfig(device="cuda", threads=4), tmp_path, workers=1)
    assert again == [1, 4, 9] and Powers.executed == ["p|1", "p|2", "p|3"]
    # anything that changes what a run computes is refused
    with pytest.raises(LedgerError, match="different 'config'"):
        run_study(Powers(), PowersConfig(power=3), tmp_path)


def test_failed_runs_are_reported_and_retried(tmp_path: Path) -> None:
    Powers.executed.clear()
    cfg = PowersConfig(numbers=[2, -1])
    assert run_study(Powers(), cfg, tmp_path) == [4]
    assert run_study(Powers(), cfg, tmp_path) == [4]
    assert Powers.executed == ["p|2", "p|-1", "p|-1"]  # the failed run is retried, the done one is not


def test_a_study_cannot_declare_a_result_field_resumable(tmp_path: Path) -> None:
    class Loose(Powers):
        resume_ignores = EXECUTION_SETTINGS | {"power"}

    with pytest.raises(TypeError, match=r"\['power'\] are not execution settings"):
        run_study(Loose(), PowersConfig(), tmp_path)
    assert not (tmp_path / "ledger.sqlite").exists()


def test_the_fingerprint_is_the_ledgers(tmp_path: Path) -> None:
    from modelward.core.ledger import RunLedger

    cfg = PowersConfig()
    ledger = RunLedger(tmp_path / "ledger.sqlite")
    assert ledger.bind_config(cfg, exclude={"device", "threads"}) == config_fingerprint(cfg, {"device", "threads"})
    assert config_fingerprint(cfg, EXECUTION_SETTINGS) == config_fingerprint(PowersConfig(device="mps"),
                                                                            EXECUTION_SETTINGS)
