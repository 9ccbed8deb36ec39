"""`modelward demo`: split training, completion hardness and a guarded API on digits, on embedded defaults."""

# lazy-imports: commands import the library on call, so `modelward --help` and this group's --help stay fast
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        out: Annotated[Path, typer.Option("--out", help="output folder (re-run to resume)")] = Path("demo-out"),
        quick: Annotated[bool, typer.Option("--quick", help="a seconds-long smoke-test version")] = False,
        workers: Annotated[int | None, typer.Option("--workers", min=1, help="parallel processes")] = None,
    ) -> None:
        """Run the main job on embedded defaults: split training -> completion study -> guarded API."""
        from modelward.demo import run_demo

        run_demo(out, Console(), quick=quick, workers=workers)
