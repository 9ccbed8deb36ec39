"""`modelward backdoor attack / detect / scan / mitigate` end to end on the shipped digits example (smaller model and
fewer steps), and the examples validate; a bad config names the field."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from modelward.backdoor.experiment import BackdoorConfig
from modelward.cli.main import app
from modelward.core.checkpoint import load_checkpoint
from modelward.core.config import load_config

torch.set_num_threads(1)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FAST = ["--set", "model.channels=[8, 16]", "--set", "model.fc=32", "--set", "train.steps=300",
        "--set", "train.eval_every=300", "--set", "attack.rate=0.1", "--set", "detect.clean_points=100",
        "--set", "detect.neural_cleanse.epochs=25", "--set", "detect.mmbd.starts=10", "--set", "detect.mmbd.steps=80",
        "--set", "mitigate.steps=150"]
runner = CliRunner()


def _run(*args: str) -> str:
    res = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output + repr(res.exception)
    return res.output


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("backdoor_*.toml")), ids=lambda p: p.name)
def test_example_configs_validate(path: Path) -> None:
    cfg = load_config(path, BackdoorConfig)
    assert cfg.attack is not None and cfg.data.source in ("digits", "synthetic_images")


@pytest.mark.slow
def test_attack_detect_scan_mitigate(tmp_path: Path) -> None:
    cfg = str(EXAMPLES / "backdoor_digits.toml")
    run = tmp_path / "bd"
    out = _run("backdoor", "attack", cfg, "--out", str(run), *FAST)
    res = json.loads((run / "attack.json").read_text())
    assert res["attack_success_rate"] > 0.9 and res["clean_accuracy"] > 0.9 and "attack success rate" in out
    assert np.load(run / "poisoned_rows.npy").sum() == res["rows_poisoned"]
    ck = load_checkpoint(run)  # a plain `modelward train` checkpoint: assess and guard serve read it
    assert ck.kind == "zoo" and ck.meta["backdoor"]["attack"] == "badnets"

    out = _run("backdoor", "detect", cfg, "--model", str(run), "--out", str(run / "detect"), *FAST)
    det = json.loads((run / "detect" / "detect.json").read_text())
    assert det["backdoored"] and "BACKDOORED" in out
    match = det["self_test"]["suspects_match"]
    assert match["neural_cleanse"] and match["mmbd"]  # both trigger detectors name the attack's target
    assert "bn_shift" in match  # the BatchNorm shift ran too (the CNN has BatchNorm layers)
    assert det["reversed_trigger"]["attack_success_rate"] > 0.8

    # clean references (detect.json files, as `detect` writes them for clean models): the same per-class numbers
    # with the suspect class brought back to the others' median, 3 % noise each; the calibrated verdict decides
    rng = np.random.default_rng(0)
    refs = []
    for i in range(3):
        verdicts = []
        for v in det["verdicts"]:
            pc = np.asarray(v["per_class"], float)
            pc[v["suspect_class"]] = np.median(pc)
            verdicts.append({**v, "per_class": list(pc * np.exp(0.03 * rng.standard_normal(len(pc))))})
        (tmp_path / f"ref{i}").mkdir()
        (tmp_path / f"ref{i}" / "detect.json").write_text(json.dumps({"verdicts": verdicts}))
        refs += ["--reference", str(tmp_path / f"ref{i}")]
    out = _run("backdoor", "detect", cfg, "--model", str(run), "--out", str(run / "detect_ref"), *refs, *FAST)
    cal = json.loads((run / "detect_ref" / "detect.json").read_text())
    assert cal["backdoored"] and "verdict decided by the clean references" in out
    ref_v = {v["detector"]: v for v in cal["verdicts"] if v["detector"].endswith("_reference")}
    assert set(ref_v) == {"neural_cleanse_reference", "mmbd_reference"}
    assert all(v["backdoored"] and v["suspect_class"] == det["self_test"]["target"] for v in ref_v.values())

    _run("backdoor", "scan", cfg, "--model", str(run), "--data", str(run / "train_data.npz"),
         "--truth", str(run / "poisoned_rows.npy"), "--out", str(run / "scan"), *FAST)
    scan = json.loads((run / "scan" / "scan.json").read_text())
    auc = {m["method"]: m["auc"] for m in scan["methods"]}
    assert auc["spectre"] > 0.9, auc
    assert (run / "scan" / "scan.csv").read_text().count("\n") == scan["rows"] + 1

    out = _run("backdoor", "mitigate", cfg, "--model", str(run), "--out", str(run / "fixed"), *FAST)
    rep = json.loads((run / "fixed" / "mitigate.json").read_text())
    assert rep["after"]["attack_success_rate"] < 0.2 < rep["before"]["attack_success_rate"]
    assert rep["after"]["clean_accuracy"] > rep["before"]["clean_accuracy"] - 0.05
    assert load_checkpoint(run / "fixed").meta["mitigated"]["method"] == "unlearning"


def test_bad_config_is_named(tmp_path: Path) -> None:
    def fails(*sets: str) -> str:
        res = runner.invoke(app, ["backdoor", "attack", str(EXAMPLES / "backdoor_digits.toml"), "--out",
                                  str(tmp_path), *[a for s in sets for a in ("--set", s)]], env={"COLUMNS": "200"})
        assert res.exit_code != 0
        return res.output + res.stderr + str(res.exception)

    text = fails("attack.name=trojan")
    assert "attack.name" in text and "badnets" in text
    assert "attack.rate" in fails("attack.params.rate=0.2")
    assert "not a class" in fails("attack.target=12")
