"""Acceptance checks found by running the README/docs commands as a user (exit codes, help texts)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _mw(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "modelward.cli.main", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "TERM": "dumb"})


def test_parts_accepts_a_study_file_as_the_readme_says():
    r = _mw("parts", "--model", "examples/completion_digits.toml")
    assert r.returncode == 0, r.stderr
    assert "conv1" in r.stdout and "13,802" in r.stdout


@pytest.mark.parametrize(("cmd", "text"), [
    (["parts"], "[model] table"),
    (["train"], "[data], [model], [train]"),
    (["robust", "certify"], "[data] and [evaluate]"),
    (["robust", "attack"], "[data] and [evaluate]"),
])
def test_help_shows_table_names(cmd, text):
    # rich markup used to swallow "[model]" etc. ("TOML file with a  table")
    r = _mw(*cmd, "--help")
    assert r.returncode == 0 and text in r.stdout, r.stdout


@pytest.mark.parametrize("cmd", [["complete", "run", "examples/completion_digits.toml"],
                                 ["robust", "train", "examples/robust_gloro.toml"],
                                 ["study", "plasticity", "examples/plasticity.toml"],
                                 ["extract", "run", "examples/extraction_digits.toml"]])
def test_out_that_is_a_file_is_a_clear_error(cmd):
    # `complete run --out <a file>` used to end in a FileExistsError traceback
    r = _mw(*cmd, "--out", "examples/completion_digits.toml")
    assert r.returncode == 2 and "is a file, not a folder" in r.stderr and "Traceback" not in r.stderr


def test_robust_train_refuses_a_different_config_in_a_finished_run(tmp_path):
    # it used to overwrite the other config's finished model.safetensors without a word
    tiny = ["--set", "model.arch=c(4,4,2).d(16)", "--set", "train.epochs=1", "--set", "train.batch_size=256"]
    out = tmp_path / "run"
    r = _mw("robust", "train", "examples/robust_gloro.toml", "--out", str(out), *tiny)
    assert r.returncode == 0, r.stderr
    before = (out / "model.safetensors").read_bytes()
    r = _mw("robust", "train", "examples/robust_gloro.toml", "--out", str(out), *tiny)  # same config: resumes
    assert r.returncode == 0, r.stderr
    r = _mw("robust", "train", "examples/robust_standard.toml", "--out", str(out), *tiny)
    assert r.returncode == 2 and "different config" in r.stderr and "train.mode" in r.stderr, r.stderr
    assert (out / "model.safetensors").read_bytes() == before


def test_train_out_that_is_a_folder_is_refused_before_training(tmp_path):
    # it used to train, then fail with an IsADirectoryError traceback when saving
    r = _mw("train", "examples/completion_digits.toml", "--out", str(tmp_path))
    assert r.returncode == 2 and "is a folder" in r.stderr and "Traceback" not in r.stderr
    assert "training" not in r.stdout
