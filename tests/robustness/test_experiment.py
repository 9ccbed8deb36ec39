"""The `robust` pipeline as a library: the reports are written by robustness.experiment, progress goes to a sink."""

import json

from modelward.core.config import validate
from modelward.core.progress import RecordingProgress
from modelward.robustness.experiment import (
    RobustConfig,
    attack_experiment,
    eval_points,
    load_model,
    train_experiment,
)
from modelward.robustness.plasticity import PlasticityConfig, plan


def test_train_and_attack_write_their_reports(tmp_path) -> None:
    cfg = validate(RobustConfig, {"data": {"source": "digits", "max_samples": 300},
                                  "model": {"arch": "c(4,4,2).d(16)"},
                                  "train": {"mode": "gloro", "epochs": 2, "batch_size": 128, "lr": 0.01},
                                  "evaluate": {"epsilons": [0.1, 0.3], "max_points": 30,
                                               "attacks": [{"name": "pgd", "params": {"steps": 3}}]}}, "test")
    rec = RecordingProgress()
    metrics = train_experiment(cfg, tmp_path, rec)
    assert rec.completed("train") == 2 and rec.events[-1][:2] == ("done", "train")
    assert json.loads((tmp_path / "metrics.json").read_text())["vra"] == metrics["vra"]
    history = json.loads((tmp_path / "history.json").read_text())
    assert [r["epoch"] for r in history] == [1, 2]
    assert (tmp_path / "history.md").read_text().startswith("# training history\n\n| epoch |")
    net, _ = load_model(tmp_path)
    from modelward.core.data import load_data

    x, y = eval_points(cfg, load_data(cfg.data))
    rows = attack_experiment(cfg, net, x, y, tmp_path, rec)
    assert [r["eps"] for r in rows] == [0.1, 0.3] and rec.completed("attacks") == 2
    assert {"attack.csv", "attack.md", "attack.json", "attack.png"} <= {p.name for p in tmp_path.iterdir()}


def test_plasticity_plan_adversarial_phase_depends_on_clean() -> None:
    runs = {r.run_id: r for r in plan(PlasticityConfig(seeds=[0, 1]))}
    assert len(runs) == 2 * 3 * 2
    assert runs["deep/s1/adversarial"].depends_on == ("deep/s1/clean",)
    assert runs["deep/s1/clean"].depends_on == ()
