"""Label leakage over real party processes (issue 10 items 9-10): Alice's own server records the gradients Bob
returns; without protection they give Alice the labels, with Bob's [label_protection] they do not."""

import json
from pathlib import Path

from typer.testing import CliRunner

from modelward.cli.split import app as split_app
from modelward.governance.leakage.parties import read_recording

EX = Path(__file__).resolve().parents[2] / "examples"
runner = CliRunner()


def test_alice_recovers_labels_from_real_bob_unless_he_protects_them(tmp_path):
    out = tmp_path / "lk"
    r = runner.invoke(split_app, ["audit-leakage", str(EX / "leakage_breast_cancer.toml"), "--out", str(out),
                                  "--transport", "parties", "--set", "train.steps=12", "--set", "model.hidden=[8]",
                                  "--set", "audit.scales=[0, 16]", "--set", "audit.methods=['marvell']",
                                  "--set", "audit.seeds=[0]"])
    assert r.exit_code == 0, r.output + str(r.exception)
    rows = {row["method"]: row for row in json.loads((out / "results_parties.json").read_text())}
    runs = {run["method"]: run for run in json.loads((out / "runs_parties.json").read_text())}
    assert runs["none"]["steps_recorded"] == runs["marvell"]["steps_recorded"] == 12
    assert rows["none"]["direction_auc"] > 0.95          # the plain gradient gives the labels away
    assert rows["marvell"]["direction_auc"] < 0.65       # Bob's protection, configured in his PARTY.toml
    assert rows["marvell"]["direction_auc_acc"] < 0.7
    bob_cfg = (out / "parties/parties_marvell_16_0/party_bob.toml").read_text()
    assert "label_protection" in bob_cfg and "marvell" in bob_cfg
    rec = read_recording(out / "parties/parties_marvell_16_0/alice/received.safetensors")
    assert len(rec) == 12 and rec[0][2].shape == (32, 8)  # what crossed the cut: one gradient row per sample
    assert (out / "tradeoff_parties.png").stat().st_size > 0
