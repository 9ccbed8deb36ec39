"""`modelward robust train / certify / attack` end to end on digits with tiny settings; example configs parse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from modelward.cli.main import app, main
from modelward.core.config import load_config
from modelward.core.io import load_state_dict
from modelward.robustness.experiment import RobustConfig, load_model

torch.set_num_threads(1)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TINY = ["--set", "model.arch=c(4,4,2).d(16)", "--set", "train.epochs=3", "--set", "train.batch_size=128",
        "--set", "train.lr=0.01", "--set", "train.lr_decay_to=0.005",
        "--set", "evaluate.max_points=60", "--set", "evaluate.epsilons=[0.1, 0.3]"]
runner = CliRunner()


def _run(*args: str) -> str:
    res = runner.invoke(app, list(args))
    assert res.exit_code == 0, res.output + repr(res.exception)
    return res.output


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("robust_*.toml")), ids=lambda p: p.name)
def test_example_configs_validate(path: Path) -> None:
    cfg = load_config(path, RobustConfig)
    assert cfg.train.epochs >= 1 and cfg.evaluate.epsilons


def test_gloro_train_certify_attack_and_resume(tmp_path: Path) -> None:
    cfg = str(EXAMPLES / "robust_gloro.toml")
    out = tmp_path / "gloro"
    _run("robust", "train", cfg, "--out", str(out), *TINY)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["mode"] == "gloro" and 0.0 <= metrics["vra"] <= metrics["clean_accuracy"] <= 1.0
    assert metrics["clean_accuracy"] > 0.3  # three epochs already learn something on digits
    weights, meta = load_state_dict(out / "model.safetensors")
    assert any(k.startswith("iterates.") for k in weights) and meta["config"]["train"]["mode"] == "gloro"

    # a second run of the same config resumes from the final checkpoint: nothing left to train, same weights
    _run("robust", "train", cfg, "--out", str(out), *TINY)
    again, _ = load_state_dict(out / "model.safetensors")
    assert all(torch.equal(weights[k], again[k]) for k in weights if k.startswith("f."))

    ev = ["--set", "evaluate.max_points=60", "--set", "evaluate.epsilons=[0.1, 0.3]",
          "--set", 'evaluate.attacks=[{name="pgd", params={norm="l2", steps=5}}]']
    _run("robust", "certify", cfg, "--model", str(out), "--out", str(out), *ev)
    rows = json.loads((out / "certify.json").read_text())
    assert [r["epsilon"] for r in rows] == [0.1, 0.3]
    for r in rows:  # certified points are a subset of the points PGD cannot break
        assert r["vra"] <= r["robust_accuracy_pgd"] + 1e-9
    assert rows[1]["vra"] <= rows[0]["vra"]
    assert (out / "certify.png").stat().st_size > 0 and (out / "certify.md").read_text().startswith("# GloRo")

    _run("robust", "attack", cfg, "--model", str(out / "model.safetensors"), "--out", str(out), *ev)
    arows = json.loads((out / "attack.json").read_text())
    assert [a["eps"] for a in arows] == [0.1, 0.3] and arows[1]["robust_accuracy"] <= arows[0]["clean_accuracy"]
    assert (out / "attack.png").is_file()


@pytest.mark.parametrize("mode", ["standard", "pgd", "rtk"])
def test_other_modes_train(tmp_path: Path, mode: str) -> None:
    out = tmp_path / mode
    extra = ["--set", f"train.mode={mode}", "--set", "train.adversarial.attack_steps=2", "--set", "train.rtk_k=2"]
    _run("robust", "train", str(EXAMPLES / "robust_gloro.toml"), "--out", str(out), *TINY, *extra)
    net, cfg = load_model(out)
    assert cfg.train.mode == mode and type(net).__name__ == ("RtkGloroNet" if mode == "rtk" else "GloroNet")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["clean_accuracy"] > 0.2


def test_bad_config_and_missing_model_are_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = str(EXAMPLES / "robust_gloro.toml")
    with pytest.raises(SystemExit) as e:
        main(["robust", "train", cfg, "--out", str(tmp_path), "--set", "train.mode=magic"])
    assert e.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "train.mode" in err and "gloro" in err
    with pytest.raises(SystemExit):
        main(["robust", "train", cfg, "--out", str(tmp_path), "--set", "model.arch=c(4,4).d(16)"])
    assert "cannot parse layer" in " ".join(capsys.readouterr().err.split())
    with pytest.raises(SystemExit):
        main(["robust", "certify", cfg, "--model", str(tmp_path / "nothing")])
    assert "no trained model" in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("mode", ["rtk", "affinity"])
def test_rtk_and_affinity_nets_train_to_a_useful_vra(tmp_path: Path, mode: str) -> None:
    """Issue 13: with the ⊥ gradient through max f (reference library) RT2 and affinity GloRo nets train; the
    thesis' stop-gradient variant saturated at VRA 0. 20 of the example's 150 epochs, certified at its ε = 0.3."""
    cfg = str(EXAMPLES / "robust_rtk.toml")
    out = tmp_path / mode
    sets = ["--set", "train.affinity_sets=[[0], [1, 7], [2], [3, 5, 8], [4, 9], [6]]"] if mode == "affinity" else []
    common = ["--set", f"train.mode={mode}", *sets]
    _run("robust", "train", cfg, "--out", str(out), "--set", "train.epochs=20", *common)
    _run("robust", "certify", cfg, "--model", str(out), "--out", str(out), *common)
    (row,) = json.loads((out / "certify.json").read_text())
    assert row["epsilon"] == 0.3 and row["vra"] > 0.5, row


def test_attack_sweep_is_checked_before_it_runs_and_errors_keep_brackets(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture) -> None:
    cfg = str(EXAMPLES / "robust_gloro.toml")
    with pytest.raises(SystemExit):
        main(["robust", "attack", cfg, "--model", str(tmp_path / "none"), "--set", "evaluate.attacks=[]"])
    assert "[[evaluate.attacks]]" in capsys.readouterr().err  # rich markup used to swallow bracketed text
    # an L∞ attack in the (ℓ2) sweep is refused before any attack runs or any model is loaded
    with pytest.raises(SystemExit):
        main(["robust", "attack", cfg, "--model", str(tmp_path / "none"),
              "--set", 'evaluate.attacks=[{name = "fgsm"}, {name = "bim"}]'])
    err = " ".join(capsys.readouterr().err.split())
    assert "evaluate.attacks[1] (bim)" in err and "linf" in err and "no trained model" not in err


# -- issue 28: AutoAttack with the sandwich, and the other certificates ------------------------------------------
AA = ["--set", "evaluate.max_points=24", "--set", "evaluate.epsilons=[0.1, 0.5]", "--steps", "10", "--queries", "50"]


@pytest.fixture(scope="module")
def relu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny ReLU net (so IBP and CROWN apply) trained for three epochs."""
    out = tmp_path_factory.mktemp("relu")
    _run("robust", "train", str(EXAMPLES / "robust_gloro.toml"), "--out", str(out), *TINY,
         "--set", "train.mode=standard", "--set", "model.activation=relu")
    return out


def test_attack_suite_autoattack_writes_the_sandwich_and_one_status_per_point(relu_run: Path) -> None:
    out = relu_run / "aa"
    text = _run("robust", "attack", str(EXAMPLES / "robust_gloro.toml"), "--model", str(relu_run), "--out", str(out),
                "--suite", "autoattack", *AA)
    assert "certified ≥" in text and "AutoAttack ≤" in text
    data = json.loads((out / "points.json").read_text())
    assert data["certificates"] == ["gloro", "crown", "ibp"]
    for row in data["rows"]:
        assert row["certified_lower"] <= row["attacked_upper"]
        assert row["gap"] == pytest.approx(row["unresolved"] / 24)
        statuses = data["points"][str(row["eps"])]
        assert len(statuses) == 24 and {p["status"] for p in statuses} <= {"certified", "broken", "unresolved"}
        assert sum(p["status"] == "broken" for p in statuses) == sum(row["broken_by"].values())
    assert data["rows"][1]["attacked_upper"] <= data["rows"][0]["attacked_upper"]
    assert (out / "sandwich.md").read_text().startswith("# Robust accuracy sandwich")
    arows = json.loads((out / "attack.json").read_text())
    assert [a["attack"] for a in arows] == ["autoattack", "autoattack"]


def test_certify_methods_ibp_crown_smoothing(relu_run: Path) -> None:
    cfg = str(EXAMPLES / "robust_gloro.toml")
    ev = ["--set", "evaluate.max_points=20", "--set", "evaluate.epsilons=[0.05, 0.2]"]
    got = {}
    for method in ("ibp", "crown"):
        out = relu_run / method
        _run("robust", "certify", cfg, "--model", str(relu_run), "--out", str(out), "--method", method, *ev)
        got[method] = json.loads((out / "certify.json").read_text())
    for i, c in zip(got["ibp"], got["crown"], strict=True):
        assert c["certified_accuracy"] >= i["certified_accuracy"]
        assert c["certified_accuracy"] <= c["clean_accuracy"]
    out = relu_run / "smoothing"
    _run("robust", "certify", cfg, "--model", str(relu_run), "--out", str(out), "--method", "smoothing",
         "--sigma", "0.25", "--n0", "20", "--n", "200", *ev)
    rows = json.loads((out / "certify.json").read_text())
    assert rows[0]["certified_accuracy"] >= rows[1]["certified_accuracy"]
    radii = json.loads((out / "radii.json").read_text())
    assert len(radii["radii"]) == 20 and max(radii["radii"]) > 0


def test_certify_refuses_unknown_methods_and_unsupported_layers(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture) -> None:
    cfg = str(EXAMPLES / "robust_gloro.toml")
    with pytest.raises(SystemExit):
        main(["robust", "certify", cfg, "--model", str(tmp_path), "--method", "magic"])
    assert "gloro, smoothing, ibp, crown" in " ".join(capsys.readouterr().err.split())
    out = tmp_path / "minmax"
    _run("robust", "train", cfg, "--out", str(out), *TINY, "--set", "train.epochs=1")
    with pytest.raises(SystemExit):
        main(["robust", "certify", cfg, "--model", str(out), "--out", str(out), "--method", "crown",
              "--set", "evaluate.max_points=4"])
    err = " ".join(capsys.readouterr().err.split())
    assert "MinMax" in err and "supported: Linear" in err
