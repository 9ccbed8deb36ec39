"""`modelward study plasticity` end to end on a tiny budget: outputs, resume through the ledger, config errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from modelward.cli.main import main
from modelward.core.ledger import RunLedger

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "plasticity.toml"
TINY = ["--set", "clean_epochs=1", "--set", "adv_epochs=1", "--set", "data.max_samples=200",
        "--set", "eval_attack.steps=2", "--set", "adversarial.attack_steps=2", "--set", "eval_attack.train_subset=40"]


class Ran:
    def __init__(self, returncode: int, output: str) -> None:
        self.returncode, self.output = returncode, output


@pytest.fixture
def cli(capsys):
    """Run the real entry point in-process (same code path as the console script, without ~7 s of imports)."""

    def run(*args: str) -> Ran:
        code = 0
        try:
            main(list(args))
        except SystemExit as e:
            code = int(e.code or 0)
        cap = capsys.readouterr()
        return Ran(code, cap.out + cap.err)

    return run


def test_plasticity_study_outputs_and_resume(tmp_path, cli):
    out = tmp_path / "study"
    r = cli("study", "plasticity", str(EXAMPLE), "--out", str(out), *TINY)
    assert r.returncode == 0, r.output[-2000:]
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert {(row["model"], row["phase"]) for row in rows} == {
        (m, p) for m in ("shallow", "deep", "shallow_matched") for p in ("clean", "adversarial")}
    params = {row["model"]: int(row["params"]) for row in rows}
    assert abs(params["shallow_matched"] - params["deep"]) < 0.02 * params["deep"]  # the matched control
    assert params["shallow"] != params["deep"]
    for row in rows:
        clean, robust, success = (float(row[k]) for k in ("test_clean", "test_robust", "attack_success"))
        assert 0.0 < clean <= 1.0 and 0.0 <= float(row["train_robust"]) <= 1.0
        # robust = correct and not flipped (+ the rare wrong point the attack turns right): ≥ clean · (1 − success)
        assert clean * (1 - success) - 1e-6 <= robust <= clean * (1 - success) + 0.05, row  # float32 rates
    md = (out / "results.md").read_text()
    assert "Test accuracy (post adversarial training)" in md and "AT accuracy cost" in md
    assert (out / "plasticity.png").stat().st_size > 1000
    assert RunLedger(out / "ledger.sqlite").counts().get("done") == 6

    # resume: a finished study recomputes nothing and reports the same numbers
    before = (out / "results.csv").read_text()
    r2 = cli("study", "plasticity", str(EXAMPLE), "--out", str(out), *TINY)
    assert r2.returncode == 0, r2.output[-2000:]
    assert (out / "results.csv").read_text() == before

    # a different config in the same folder is refused
    r3 = cli("study", "plasticity", str(EXAMPLE), "--out", str(out), *TINY, "--set", "adv_epochs=2")
    assert r3.returncode != 0 and "different" in r3.output
    # ... and leaves the folder's config.json describing its results (UAT: it was overwritten by the refused run)
    assert json.loads((out / "config.json").read_text())["adv_epochs"] == 1


def test_plasticity_config_errors_name_the_field(tmp_path, cli):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[models]]\nname = "a"\nmatch_params_of = "nope"\n')
    r = cli("study", "plasticity", str(bad), "--out", str(tmp_path / "o"))
    assert r.returncode == 2
    assert "match_params_of" in r.output and "valid" in r.output
