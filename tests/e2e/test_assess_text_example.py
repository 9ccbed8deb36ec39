"""examples/assess_text_classifier.toml as shipped, end to end: its prepare script builds and trains a 2-layer BERT
classifier from a transformers config on a seeded topic task and saves it with save_pretrained; one `modelward
assess` command (quick profile, fewer points through --set) gives a report whose figures agree with an independent
computation on the same points: the clean accuracy of the first test texts through transformers itself, and an own
loss attack (per-row cross-entropy) equal to the section's loss-threshold scores."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason="the text extra (transformers) is not installed")
pytest.importorskip("datasets", reason="the text extra (datasets) is not installed")
pytest.importorskip("picklescan", reason="the scan extra is not installed")

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["sizes.n_eval=40", "sizes.mia_points=60", "sizes.shadows=2", "train.steps=80", "sizes.query_budget=100",
         "sizes.substitute_epochs=2", "sizes.explain_points=20", "sizes.pgd_steps=5"]


@pytest.mark.slow
def test_the_text_example_runs_as_shipped_and_agrees_with_an_own_computation(tmp_path):
    shutil.copy(ROOT / "examples" / "assess_text_classifier.toml", tmp_path)
    (tmp_path / "text_classifier").mkdir()
    shutil.copy(ROOT / "examples" / "text_classifier" / "prepare.py", tmp_path / "text_classifier")
    spec = importlib.util.spec_from_file_location("text_prepare", tmp_path / "text_classifier" / "prepare.py")
    prepare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepare)
    acc = prepare.main(tmp_path / "text_classifier", n_train=300, n_test=200, steps=150)
    assert acc > 0.6  # the model learned its task (chance: 1/3)

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "modelward.cli.main", "assess", str(tmp_path / "assess_text_classifier.toml"),
           "--out", str(tmp_path / "out"), *(a for s in SMALL for a in ("--set", s))]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    sec = {s["section"]: s for s in report["sections"]}
    assert all(s["status"] == "assessed" for s in sec.values()), {k: s["reason"] for k, s in sec.items()}
    assert not report["warnings"]  # the model matches its data: verdicts are given
    scanned = {Path(f["path"]).name: f for f in report["model_files"]}  # the model folder, scanned before loading
    assert set(scanned) == {"config.json", "model.safetensors"} and all(f["clean"] for f in scanned.values())
    assert "planned:" in sec["robustness"]["plan"]["text"] and sec["robustness"]["plan"]["units"] > 0
    assert "HotFlip" in (tmp_path / "out" / "progress.log").read_text()

    # an independent path to the same numbers: transformers' own model and tokenizer on the parquet texts
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = tmp_path / "text_classifier" / "model"
    model = AutoModelForSequenceClassification.from_pretrained(folder, local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    import pandas as pd

    train = pd.read_parquet(tmp_path / "text_classifier" / "train.parquet")
    test = pd.read_parquet(tmp_path / "text_classifier" / "test.parquet")

    def logits(texts: list[str]) -> torch.Tensor:
        enc = tok(texts, padding=True, truncation=True, max_length=32, return_tensors="pt")
        with torch.no_grad():
            return model(**enc).logits.double()

    first = test.iloc[:40]
    clean = float((logits(list(first.text)).argmax(1).numpy() == first.label.to_numpy()).mean())
    clean_metric = next(m for m in sec["robustness"]["metrics"] if m["key"] == "clean_accuracy")
    assert clean_metric["value"] == pytest.approx(clean, abs=1e-9)  # the same 40 texts, the same answers

    pts = np.load(tmp_path / "out" / "privacy" / "points.npz")
    rows = [train.iloc[i] for i in pts["members"]] + [test.iloc[i] for i in pts["non_members"]]
    texts, labels = [r.text for r in rows], torch.tensor([int(r.label) for r in rows])
    own = -torch.nn.functional.cross_entropy(logits(texts), labels, reduction="none").numpy()
    scores = np.load(tmp_path / "out" / "privacy" / "loss.scores.npy")
    members = np.load(tmp_path / "out" / "privacy" / "loss.members.npy")
    assert members.tolist() == [True] * len(pts["members"]) + [False] * len(pts["non_members"])
    # float32 logits from two batchings (padding to different lengths): equal to float32 rounding of the loss
    np.testing.assert_allclose(scores, own, rtol=1e-4, atol=1e-5)
