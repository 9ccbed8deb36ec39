"""`modelward split audit-leakage` end to end on the shipped breast_cancer example (a few steps)."""

import json
from pathlib import Path

from typer.testing import CliRunner

from modelward.cli.party import app as party_app
from modelward.cli.split import app as split_app

EX = Path(__file__).resolve().parents[2] / "examples"
runner = CliRunner()


def test_audit_leakage_writes_results_and_plot_and_resumes(tmp_path):
    args = ["audit-leakage", str(EX / "leakage_breast_cancer.toml"), "--out", str(tmp_path / "lk"),
            "--set", "train.steps=20", "--set", "audit.scales=[0, 16]", "--set", "audit.seeds=[0]",
            "--set", "audit.methods=['marvell']", "--set", "model.hidden=[16]",
            # the other direction, small: one defense, the decoder and a short hijacking, few steps
            "--set", "inputs.defenses=[{}]", "--set", "inputs.seeds=[0]", "--set", "inputs.attacks=['decoder', 'fsha']",
            "--set", "inputs.surrogate_steps=30", "--set", "inputs.decoder_steps=30", "--set", "inputs.rows=16",
            "--set", "inputs.fsha_grad_scales=[0.01]"]
    r = runner.invoke(split_app, args)
    assert r.exit_code == 0, r.output
    out = tmp_path / "lk"
    for f in ("results.csv", "results.md", "results.json", "runs.json", "tradeoff.png"):
        assert (out / f).stat().st_size > 0, f
    rows = {(row["method"], row["scale"]): row for row in json.loads((out / "results.json").read_text())}
    assert set(rows) == {("none", 0.0), ("marvell", 16.0)}
    assert rows[("none", 0.0)]["direction_auc"] > 0.95           # Alice recovers the labels from plain gradients
    assert rows[("marvell", 16.0)]["direction_auc"] < 0.65       # not from Bob's protected ones
    assert "Label leakage audit" in (out / "results.md").read_text()
    inputs = {r["attack"]: r for r in json.loads((out / "inputs.json").read_text())}
    assert set(inputs) == {"decoder", "fsha"} and all(r["defense"] == "none" for r in inputs.values())
    assert all(r["mse"] > 0 and r["mean_mse"] > 0 and 0 <= r["canary_auc"] <= 1 for r in inputs.values())
    assert "Input reconstruction audit" in (out / "inputs.md").read_text() and "| decoder |" in r.output
    again = runner.invoke(split_app, args)  # resumes from the ledger: nothing re-run, same table
    assert again.exit_code == 0 and json.loads((out / "results.json").read_text())[0] == list(rows.values())[0]


def test_audit_leakage_bad_config_names_choices(tmp_path):
    r = runner.invoke(split_app, ["audit-leakage", str(EX / "leakage_digits.toml"), "--out", str(tmp_path),
                                  "--set", "audit.methods=['gaussian']"])
    assert r.exit_code != 0
    assert "audit.methods" in str(r.exception) + r.output and "marvell" in str(r.exception) + r.output


def test_party_fingerprint_cli_prints_both_pins(tmp_path):
    r = runner.invoke(party_app, ["keygen", "carol", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "sha256:" in r.output and (tmp_path / "carol.key").stat().st_mode & 0o077 == 0
    r2 = runner.invoke(party_app, ["fingerprint", str(tmp_path / "carol.pem")])
    lines = r2.output.split()
    assert lines[0].startswith("sha256:") and lines[1].startswith("spki-sha256:") and lines[0] in r.output
    again = runner.invoke(party_app, ["keygen", "carol", "--out", str(tmp_path)])
    assert again.exit_code != 0 and "--force" in str(again.exception)
