"""The detection study: one run per model through the ledger, resumed without recomputing, a changed config refused,
and the summary tables' arithmetic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from modelward.backdoor.experiment import (
    AttackSpec,
    DetectOptions,
    MMBDOptions,
    NeuralCleanseOptions,
    ScanOptions,
)
from modelward.backdoor.study import (
    BackdoorStudyConfig,
    DatasetSpec,
    StripOptions,
    calibrated_tables,
    execute_run,
    plan_runs,
    run_backdoor_study,
    summary_tables,
)
from modelward.core.data import DataConfig
from modelward.core.train import TrainConfig
from modelward.errors import LedgerError

from .conftest import SMALL


def tiny(seeds: list[int]) -> BackdoorStudyConfig:
    return BackdoorStudyConfig(
        datasets=[DatasetSpec(name="digits", data=DataConfig(source="digits"), model=SMALL,
                              train=TrainConfig(steps=150, eval_every=150),
                              attacks=[AttackSpec(name="badnets", rate=0.1, params={"size": 2})])],
        clean_seeds=seeds, attack_seeds=seeds, mitigate_seeds=1, save_models=True,
        detect=DetectOptions(clean_points=50, neural_cleanse=NeuralCleanseOptions(epochs=3),
                             mmbd=MMBDOptions(starts=3, steps=20)),
        scan=ScanOptions(methods=["spectre"]), strip=StripOptions(n=4))


def test_the_study_runs_once_resumes_and_refuses_another_config(tmp_path: Path) -> None:
    cfg = tiny([1])
    assert [r.run_id for r in plan_runs(cfg)] == ["digits|clean|1", "digits|badnets|1"]
    calls: list[str] = []

    def counting(run_id: str, spec: dict[str, Any], deps: dict, out: str | None = None) -> dict[str, Any]:
        calls.append(run_id)
        return execute_run(run_id, spec, deps, out=out)

    tables = run_backdoor_study(cfg, tmp_path, execute=counting)
    assert calls == ["digits|clean|1", "digits|badnets|1"]
    row = tables["attacks"][0]
    assert row["attack"] == "badnets" and row["models"] == 1 and 0.0 <= row["spectre_auc"] <= 1.0
    assert tables["clean"][0]["models"] == 1 and len(tables["mitigation"]) == 2  # unlearning and fine-pruning
    assert (tmp_path / "models" / "digits_badnets_1" / "changed_rows.npz").is_file()
    assert (tmp_path / "summary_attacks.md").is_file()
    run_backdoor_study(cfg, tmp_path, execute=counting)
    assert len(calls) == 2  # resumed: nothing recomputed
    with pytest.raises(LedgerError):
        run_backdoor_study(cfg.model_copy(update={"clean_seeds": [2]}), tmp_path)


def _r(attack: str, flagged: tuple[bool, bool], stat: tuple[float, float], seed: int = 0) -> dict[str, Any]:
    r: dict[str, Any] = {"dataset": "d", "attack": attack, "seed": seed, "backdoored": attack != "clean",
                         "clean_accuracy": 0.9, "strip": {"frr": 0.05, "tpr": 0.8}}
    if attack != "clean":
        r.update({"asr": 0.9, "target": 1})
    r["neural_cleanse"] = {"flagged": flagged[0], "statistic": stat[0], "suspect": 1}
    r["mmbd"] = {"flagged": flagged[1], "statistic": stat[1], "suspect": 2}
    return r


def test_summary_rates_and_auc() -> None:
    results = [_r("clean", (False, False), (0.5, 0.2)), _r("clean", (False, True), (1.0, 2.0), 1),
               _r("blend", (True, False), (3.0, 0.1)), _r("blend", (False, False), (0.8, 0.3), 1)]
    t = summary_tables(results)
    clean, blend = t["clean"][0], t["attacks"][0]
    assert clean["mmbd_fpr"] == 0.5 and clean["either_fpr"] == 0.5 and clean["neural_cleanse_fpr"] == 0.0
    assert blend["neural_cleanse_tpr"] == 0.5 and blend["neural_cleanse_target_found"] == 0.5
    assert blend["mmbd_target_found"] == 0.0 and blend["either_tpr"] == 0.5
    auc = {a["detector"]: a["auc"] for a in t["auc"]}
    assert auc["neural_cleanse"] == 0.75 and auc["mmbd"] == 0.25  # NC: 3.0 beats both clean, 0.8 one; MM-BD: 0.3 > 0.2 only


def test_calibrated_thresholds_come_from_other_clean_models() -> None:
    calibration = [_r("clean", (False, False), (1.0, 0.5)), _r("clean", (False, False), (2.5, 0.9), 1)]
    results = [_r("clean", (True, False), (2.4, 0.4)), _r("clean", (True, False), (2.6, 1.2), 1),
               _r("blend", (True, True), (3.0, 0.8)), _r("blend", (False, False), (1.5, 2.0), 1)]
    rows = {r["models"]: r for r in calibrated_tables(results, calibration)}
    assert rows["clean"]["neural_cleanse_threshold"] == 2.5 and rows["clean"]["mmbd_threshold"] == 0.9
    assert rows["clean"]["neural_cleanse_rate"] == 0.5 and rows["clean"]["either_rate"] == 0.5  # 2.6 > 2.5
    assert rows["blend"]["neural_cleanse_rate"] == 0.5 and rows["blend"]["mmbd_rate"] == 0.5
    assert rows["blend"]["either_rate"] == 1.0 and rows["clean"]["calibration_models"] == 2
