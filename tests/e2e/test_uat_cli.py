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
