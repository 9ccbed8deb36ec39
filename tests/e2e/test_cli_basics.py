"""The CLI as a user meets it (issue 31 items 11, 12): a light --help, --version, full tables and progress lines
in logs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": SRC, **extra}
    env.pop("COLUMNS", None)
    return env


def test_help_and_version_import_neither_torch_nor_matplotlib():
    probe = ("import sys\nfrom modelward.cli.main import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n"
             "    pass\nprint('HEAVY', [m for m in ('torch', 'matplotlib') if m in sys.modules])\n")
    for args in (["--help"], ["--version"]):
        r = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=120,
                           env=_env())
        assert "HEAVY []" in r.stdout, r.stdout[-500:] + r.stderr[-2000:]
    r = subprocess.run([sys.executable, "-m", "modelward.cli.main", "--help"], capture_output=True, text=True,
                       timeout=120, env=_env())
    assert r.returncode == 0 and "train" in r.stdout and "guard" in r.stdout and "--version" in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= 100  # the help stays readable in a pipe
    r = subprocess.run([sys.executable, "-m", "modelward.cli.main", "--version"], capture_output=True, text=True,
                       timeout=120, env=_env())
    assert r.returncode == 0 and r.stdout.startswith("modelward ")


LONG = '''
import torch

def build(input_shape=None, num_classes=2):
    net = torch.nn.Sequential()
    net.add_module("a_part_with_a_name_much_longer_than_eighty_columns_of_a_log_file_bayesian_last_layer", torch.nn.Linear(4, 3))
    net.add_module("logits", torch.nn.Linear(3, num_classes))
    net.part_names = list(dict(net.named_children()))
    return net
'''


def test_tables_are_not_cut_when_stdout_is_not_a_terminal(tmp_path):
    (tmp_path / "longnet.py").write_text(LONG)
    (tmp_path / "m.toml").write_text('input_shape = [4]\nnum_classes = 2\n[model]\narch = "entrypoint"\n'
                                     'entrypoint = "longnet:build"\n')
    r = subprocess.run([sys.executable, "-m", "modelward.cli.main", "parts", "--model", "m.toml", "--trust-code"],
                       capture_output=True,
                       text=True, timeout=120, cwd=tmp_path, env=_env(PYTHONPATH=f"{tmp_path}{os.pathsep}{SRC}"))
    assert r.returncode == 0, r.stderr
    assert "a_part_with_a_name_much_longer_than_eighty_columns_of_a_log_file_bayesian_last_layer" in r.stdout
    assert "…" not in r.stdout


PLAIN = """
import time
from rich.console import Console
from modelward.core.progress import RichProgress
with RichProgress(Console()) as p:
    p.start("runs", 10, "study")
    for i in range(10):
        time.sleep(0.15)
        p.advance("runs", 1, f"run {i} done")
    p.done("runs")
"""


def test_long_work_prints_plain_progress_lines_when_not_on_a_terminal():
    r = subprocess.run([sys.executable, "-c", PLAIN], capture_output=True, text=True, timeout=120,
                       env=_env(MODELWARD_PROGRESS_SECONDS="0.3"))
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stdout.splitlines() if x.startswith("study: ")]
    assert len(lines) >= 3, r.stdout  # ~1.5 s of work, a line every 0.3 s, and the last one
    assert lines[-1].startswith("study: 10/10 (100%)") and "run 9 done" in lines[-1]
    assert all("\x1b" not in x and "\r" not in x for x in lines)  # plain text for logs
