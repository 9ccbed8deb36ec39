"""`modelward privacy audit / invert / property` end to end with tiny settings; example configs validate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from modelward.cli.main import app
from modelward.core.config import load_config
from modelward.privacy import metrics
from modelward.privacy.audit import AuditConfig
from modelward.privacy.dp_audit import DPAuditConfig
from modelward.privacy.inspect_models import InvertConfig
from modelward.privacy.property import PropertyConfig
from modelward.privacy.served import ServedAuditConfig

torch.set_num_threads(1)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
runner = CliRunner()
KINDS = {"privacy_invert": InvertConfig, "privacy_property": PropertyConfig, "privacy_dp_audit": DPAuditConfig,
         "privacy_served_digits": ServedAuditConfig}


def _run(*args: str) -> str:
    res = runner.invoke(app, list(args))
    assert res.exit_code == 0, res.output + repr(res.exception)
    return res.output


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("privacy_*.toml")), ids=lambda p: p.name)
def test_example_configs_validate(path: Path) -> None:
    load_config(path, KINDS.get(path.stem, AuditConfig))


TINY_AUDIT = """
name = "tiny"
[data]
source = "breast_cancer"
[model]
arch = "mlp"
hidden = [16]
[train]
lr = 0.1
batch_size = 32
steps = 60
[shadows]
count = 4
[[attacks]]
name = "naive"
[[attacks]]
name = "bayesian_wb"
params = { proxies = 2 }
calibrate = [0.9]
[[attacks]]
name = "lira"
"""


def test_audit_writes_tables_arrays_roc_and_resumes(tmp_path: Path) -> None:
    cfg, out = tmp_path / "tiny.toml", tmp_path / "a"
    cfg.write_text(TINY_AUDIT)
    text = _run("privacy", "audit", str(cfg), "--out", str(out))
    assert "tiny: membership inference" in text and "naive" in text
    rows = json.loads((out / "results.json").read_text())
    assert [r["attack"] for r in rows] == ["naive", "bayesian_wb", "bayesian_wb@0.9", "lira"]
    assert (out / "roc.png").stat().st_size > 0 and (out / "targets.md").is_file()
    assert (out / "models" / "proxies_r0.safetensors").is_file()  # trained once in the proxies run, reused
    # any tool can recompute the metrics from the saved arrays
    s = np.load(out / "scores" / "bayesian_wb_r0.scores.npy")
    m = np.load(out / "scores" / "bayesian_wb_r0.members.npy")
    row = next(r for r in rows if r["attack"] == "bayesian_wb")
    assert metrics.evaluate(s, m, 0.0).accuracy == pytest.approx(row["accuracy"])
    mtime = (out / "models" / "target_r0.safetensors").stat().st_mtime
    _run("privacy", "audit", str(cfg), "--out", str(out))  # resume: nothing is re-run
    assert (out / "models" / "target_r0.safetensors").stat().st_mtime == mtime
    assert json.loads((out / "results.json").read_text()) == rows
    res = runner.invoke(app, ["privacy", "audit", str(cfg), "--out", str(out), "--set", "train.steps=61"])
    assert res.exit_code != 0 and "different" in str(res.exception)  # another config over this study: refused


def test_bad_audit_config_names_the_field(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[[attacks]]\nname = "lira2"\n')
    res = runner.invoke(app, ["privacy", "audit", str(cfg), "--out", str(tmp_path / "o")])
    assert res.exit_code != 0
    assert "lira2" in str(res.exception) and "valid choices" in str(res.exception)
    cfg.write_text('[[attacks]]\nname = "lira"\nparams = { onlin = true }\n')
    res = runner.invoke(app, ["privacy", "audit", str(cfg), "--out", str(tmp_path / "o")])
    assert "onlin" in str(res.exception) and "global_variance" in str(res.exception)


def test_invert_and_property_write_image_grids(tmp_path: Path) -> None:
    _run("privacy", "invert", str(EXAMPLES / "privacy_invert.toml"), "--out", str(tmp_path / "inv"),
         "--set", "trainers=[\"gloro\"]", "--set", "train.hidden=[16]", "--set", "train.epochs=1",
         "--set", "inversion.steps=5", "--set", "max_train=30", "--set", "matches=4")
    assert (tmp_path / "inv" / "inversions_gloro.png").is_file() and (tmp_path / "inv" / "columns_gloro.png").is_file()
    _run("privacy", "property", str(EXAMPLES / "privacy_property.toml"), "--out", str(tmp_path / "prop"),
         "--set", "shadow_models=5", "--set", "properties=2", "--set", "universe=3", "--set", "trainers=[\"pgd\"]",
         "--set", "train.hidden=[8]", "--set", "train.epochs=1", "--set", "train.pgd_steps=2",
         "--set", "subsample=0.05", "--set", "inversion.reconstructions=2", "--set", "inversion.steps=3",
         "--set", "meta.epochs=1", "--set", "meta.hidden=8")
    res = json.loads((tmp_path / "prop" / "results.json").read_text())
    assert res[0]["trainer"] == "pgd" and res[0]["test_models"] == 1
    assert (tmp_path / "prop" / "reconstructions_pgd_model0.png").is_file()


TINY_LABEL_ONLY = """
name = "tiny-lo"
[data]
source = "digits"
[model]
arch = "mlp"
hidden = [32]
[train]
lr = 0.1
batch_size = 32
steps = 150
[[attacks]]
name = "loss"
[[attacks]]
name = "boundary"
params = { iterations = 1, grad_queries = 10, binary_steps = 6 }
[[attacks]]
name = "augmentation"
params = { samples = 8 }
"""


def test_audit_reports_epsilon_lb_slices_and_exposed_records(tmp_path: Path) -> None:
    cfg, out = tmp_path / "lo.toml", tmp_path / "lo"
    cfg.write_text(TINY_LABEL_ONLY)
    text = _run("privacy", "audit", str(cfg), "--out", str(out))
    assert "ε_lb" in text and "worst slice" in text
    rows = {r["attack"]: r for r in json.loads((out / "results.json").read_text())}
    assert set(rows) == {"loss", "boundary", "augmentation"}
    for name, r in rows.items():  # the ε lower bound is the one recomputed from the saved arrays
        s = np.load(out / "scores" / f"{name}_r0.scores.npy")
        m = np.load(out / "scores" / f"{name}_r0.members.npy")
        assert r["epsilon_lb"] == pytest.approx(metrics.evaluate(s, m, 0.0).epsilon_lb)
    slices = json.loads((out / "slices.json").read_text())
    assert {s["slice"] for s in slices} >= {"all", "class=0", "class=9", "correct"}
    assert sum(s["worst"] for s in slices if s["attack"] == "loss") == 1
    exposed = [e for e in json.loads((out / "exposed.json").read_text()) if e["attack"] == "loss"]
    assert len(exposed) == 20 and all(e["fpr_low"] <= e["exposure_fpr"] <= e["fpr_high"] for e in exposed)
    assert [e["exposure_fpr"] for e in exposed] == sorted(e["exposure_fpr"] for e in exposed)


def test_audit_dp_cli_reports_claimed_vs_audited(tmp_path: Path) -> None:
    text = _run("privacy", "audit-dp", str(EXAMPLES / "privacy_dp_audit.toml"), "--out", str(tmp_path / "dp"),
                "--set", "model.hidden=[16]", "--set", "epochs=10", "--set", "target_epsilon=1.0",
                "--set", "canaries.white_box=200", "--set", "canaries.black_box=40", "--set", "guesses=[50, 100]",
                "--set", "noise_divisor=8")
    assert "claimed ε" in text and "rdp" in text and "CLAIM VIOLATED" in text and "broken on purpose" in text
    rows = json.loads((tmp_path / "dp" / "results.json").read_text())
    assert [r["variant"] for r in rows] == ["white-box", "black-box"]
    assert rows[0]["epsilon_lb"] > rows[0]["claimed_epsilon"]


TINY_SERVED = """
name = "tiny-served"
eval_points = 30
attacks = ["loss", "boundary", "augmentation", "knockoff"]
extraction_budget = 60
extraction_epochs = 2
[model]
arch = "mlp"
hidden = [16]
[train]
lr = 0.1
batch_size = 32
steps = 100
[boundary]
iterations = 1
grad_queries = 5
binary_steps = 4
init_tries = 5
[augmentation]
samples = 4
[[defenses]]
name = "top1"
"""


def test_audit_through_the_served_api(tmp_path: Path) -> None:
    cfg, out = tmp_path / "served.toml", tmp_path / "served"
    cfg.write_text(TINY_SERVED)
    text = _run("privacy", "audit", str(cfg), "--guard", str(EXAMPLES / "guard_modelguard_w.toml"), "--out", str(out))
    assert "KnockoffNets" in text and "top1" in text
    rows = json.loads((out / "results.json").read_text())
    assert [r["attack"] for r in rows] == ["loss", "boundary", "augmentation", "knockoff"]
    assert all(r["defense"] == "top1" for r in rows)
    by = {r["attack"]: r for r in rows}
    assert by["boundary"]["queries"] > 60 and 0 <= by["knockoff"]["accuracy"] <= 1
    # top-1 answers are one-hot: the loss attack on served probabilities sees only right / wrong
    s = np.load(out / "scores" / "top1_loss.scores.npy")
    assert set(np.round(s, 6)) <= {0.0, round(float(np.log(1e-12)), 6)}
    # the served config carries the audit's own key only: the user's keys and budgets are never spent
    served = (out / "guards" / "top1" / "guard.toml").read_text()
    assert "privacy-audit" in served and "change-me-analyst-key" not in served
    assert "top1" in (out / "table.md").read_text()
