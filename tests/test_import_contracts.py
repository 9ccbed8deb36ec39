"""The import contracts of pyproject.toml ``[tool.importlinter]`` hold: the house's layers (an area imports only
areas below it; core imports no area) and no import circle between the modules of any folder. The same check runs
in ``make lint`` as ``lint-imports``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contracts_are_kept() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    code = ("import sys; from importlinter.cli import lint_imports; "
            "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout and "house-layers" not in r.stdout  # ids are not printed; names are
    assert "The house's layers" in r.stdout and "No import circles" in r.stdout
