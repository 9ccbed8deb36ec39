"""`modelward split audit-extraction` (issue 26 item 3, issue 36 item 7) on the shipped example, shortened: real
party processes under Bob's shipped policy, every neighbour attack refused or at chance, the files a user reads."""

import csv
import json
from pathlib import Path

from typer.testing import CliRunner

from modelward.cli.main import app

EX = Path(__file__).resolve().parents[2] / "examples"


def test_audit_extraction_on_the_example_under_the_defaults(tmp_path):
    # (label-only and the committed-window loss oracle, each on a fresh Bob, are in
    # test_governance_composition_attacks.py: here one fresh-budget attack, eval differencing, stands for them)
    sets = ["train.steps=23", "train.eval_every=23", "attacks.checkpoints=[64]", 'attacks.predict_pools=["natural"]',
            "attacks.eval_points=[80]", "attacks.labels_rows=64", "attacks.fit_steps=20",
            "attacks.differencing_points=[640]", "attacks.loss_probes=16",
            'attacks.skip=["eval_differencing_repeated", "label_only", "loss_oracle_committed"]',
            "attacks.options.slow_poisoning.attempts=12"]  # (the full attack: tests/e2e/test_governance_poisoning.py)
    r = CliRunner().invoke(app, ["split", "audit-extraction", str(EX / "audit_extraction_digits.toml"), "--out",
                                 str(tmp_path / "out"), *[a for s in sets for a in ("--set", s)]],
                           env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output + repr(r.exception)
    rows = list(csv.DictReader((tmp_path / "out/extraction.csv").open()))
    assert list(rows[0])[:5] == ["part", "attack", "rows", "agreement", "refused"]
    by = {row["attack"]: row for row in rows}
    for attack in ("predict_natural", "eval_oracle", "labels_from_answers"):
        assert by[attack]["refused"] == "True" and by[attack]["rows"] == "0", by[attack]
        assert by[attack]["agreement"] == by[attack]["chance"]
    assert float(by["labels_from_gradients"]["rows"]) > 0
    # issue 36: every attack listed, none above 0.30 (chance about 0.1); eval differencing gets a few noisy answers
    # and then Bob's privacy budget for alice is spent; the loss oracle's steps bring back no loss at all
    assert {"eval_differencing", "loss_oracle"} <= set(by)
    assert all(float(row["agreement"]) <= 0.30 for row in rows), rows
    assert by["eval_differencing"]["refused"] == "True" and "privacy budget" in by["eval_differencing"]["note"]
    assert by["loss_oracle"]["rows"] == str(8 * 26) and "no loss released" in by["loss_oracle"]["note"]
    # issue 36 item 2: the slow poisoning is listed too, scored as the test accuracy Bob lost (chance 0)
    poison = by["slow_poisoning"]
    assert poison["chance"] == "0.0" and int(poison["rows"]) % 64 == 0 and "at the stop" in poison["note"], poison
    assert "slow poisoning: " in r.output
    summary = json.loads((tmp_path / "out/extraction.json").read_text())
    assert summary["policy"]["predict"]["result_receiver"] == "owner" and summary["test_accuracy"] > 0.5
    assert all(v is None or v > 0 for v in summary["completion_rows"].values())
    assert (tmp_path / "out/extraction.png").stat().st_size > 1000
