"""The extraction harness and the demo step against the guarded HTTP service on 127.0.0.1 (real processes)."""

from __future__ import annotations

import csv

import torch
from rich.console import Console

from modelward.core.config import validate
from modelward.core.data import DataConfig, load_data
from modelward.core.train import TrainConfig, train
from modelward.core.zoo import ModelConfig, build_model
from modelward.extraction.config import ExtractionConfig
from modelward.extraction.demo import run_extraction_demo
from modelward.extraction.study import run_evaluation


def test_harness_attacks_a_served_modelguard_s(tmp_path):
    cfg = validate(ExtractionConfig, {
        "budget": 100, "data": {"source": "digits", "test_fraction": 0.25, "max_samples": 600},
        "victim": {"model": {"arch": "mlp", "hidden": [24]}, "train": {"steps": 100, "lr": 0.1},
                   "temperature": 2.0, "cache_dir": str(tmp_path / "cache"), "serve": True},
        "substitute": {"epochs": 3, "lr": 0.1},
        "defenses": [{"name": "modelguard_s", "epsilons": [1.0]}], "attacks": [{"strategy": "naive"}],
    }, "test")
    run_evaluation(cfg, tmp_path / "run")
    with open(tmp_path / "run" / "results.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert int(row["queries_used"]) == 100
    # answers came through the server's quantizer: perturbed (T = 2 victim), but within ε and top-1 kept
    assert 0.05 < float(row["max_l1"]) <= 1.0 + 1e-5
    assert float(row["accuracy"]) > 0.2  # the substitute learned from the quantized answers (chance: 0.1)


def test_demo_step_serves_and_extracts(tmp_path):
    data = load_data(DataConfig(source="digits", max_samples=600))
    mc = ModelConfig(arch="cnn", channels=[4, 8], fc=16)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = build_model(mc, data.input_shape, data.num_classes)
    train(model, data.x_train, data.y_train, data.x_test, data.y_test, TrainConfig(steps=150, lr=0.05), seed=0)
    console = Console(record=True, width=120)
    out = run_extraction_demo(tmp_path, model, mc, data, console, seed=0, budget=150, epochs=12)
    assert out["guarded"]["queries"] == out["unguarded"]["queries"] == 150
    assert out["guarded"]["url"].startswith("http://127.0.0.1:")
    assert out["unguarded"]["accuracy"] > 0.3  # chance is 0.1
    assert out["guarded"]["accuracy"] > 0.2  # ModelGuard-S keeps top-1: a naive attacker still learns (chance 0.1)
    text = console.export_text()
    assert "ModelGuard-S over HTTP" in text and "unguarded" in text
