"""Every Python snippet in docs/api.md runs (the first one sets up; each later one starts from its names)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def test_every_area_has_a_short_snippet() -> None:
    assert len(SNIPPETS) >= 9
    for code in SNIPPETS:
        lines = [ln for ln in code.splitlines() if ln.strip()]
        body = [ln for ln in lines if not ln.startswith(("import ", "from ")) and not ln.startswith(" " * 4 + ")")]
        assert len(body) <= 10, code


@pytest.fixture(scope="module")
def setup_namespace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    import os

    import torch

    torch.set_num_threads(1)
    cwd = os.getcwd()
    # the snippets write under runs/; the working folder is restored afterwards, or every later test (and any
    # subprocess it starts with a relative PYTHONPATH=src) would run in this temporary folder
    os.chdir(tmp_path_factory.mktemp("api"))
    try:
        ns: dict = {"__name__": "api_docs"}
        exec(compile(SNIPPETS[0], f"{DOC}:snippet0", "exec"), ns)  # noqa: S102 - our own documentation
        yield ns
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("i", range(1, len(SNIPPETS)))
def test_snippet_runs(i: int, setup_namespace: dict, capsys: pytest.CaptureFixture) -> None:
    t0 = time.perf_counter()
    exec(compile(SNIPPETS[i], f"{DOC}:snippet{i}", "exec"), dict(setup_namespace))  # noqa: S102
    assert capsys.readouterr().out.strip(), "every snippet shows its result"
    assert time.perf_counter() - t0 < 60
