"""``modelward explain CONFIG --out DIR``: attribution tables and image grids (seed 002 Ch. 3).

Per model: input attributions of the true class by saliency / integrated gradients / SmoothGrad / gradient×input
(``<model>/attributions.*``, ``attributions.png``) and the most influential units of a slice per class, shown by
input attribution and by inversion (``<model>/top_units.*``, ``top_units_*.png``); across models: ``compare.*``.
Runs go through the shared runner: re-running the command resumes.
"""

# lazy-imports: commands import the library on call, so `modelward --help` and this group's --help stay fast
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from modelward.cli._device import DeviceOption, with_device


def register(app: typer.Typer) -> None:
    @app.command("explain")
    def explain_cmd(
        config: Annotated[Path, typer.Argument(help="TOML with \\[data], \\[\\[models]] and \\[explain] "
                                                    "(see examples/explain_digits.toml)")],
        out: Annotated[Path, typer.Option("--out", help="output folder (re-running resumes it)")],
        set_: Annotated[list[str] | None, typer.Option("--set", help="override key=value, e.g. "
                                                                      "explain.n_inputs=4")] = None,
        device: DeviceOption = None,
    ) -> None:
        """Explain models with internal influence: input attributions and top internal units per class."""
        from modelward.cli._outdir import check_out_dir
        from modelward.core.config import load_config
        from modelward.core.progress import RichProgress
        from modelward.errors import ModelwardError
        from modelward.explain.study import ExplainConfig, run_explain

        console = Console()
        cfg = load_config(config, ExplainConfig, with_device(set_, device))
        check_out_dir(out)
        with RichProgress(console) as progress:
            outcome = run_explain(cfg, out, progress, base=Path.cwd())
        for rid, res in sorted(outcome.results.items()):
            console.print(f"{rid}: {res}")
        console.print(f"{outcome.done}/{outcome.total} runs done · results in {out}")
        if outcome.failed:
            first = next(iter(outcome.failed.items()))
            raise ModelwardError(f"{len(outcome.failed)} run(s) failed (re-run to retry); first: {first[0]}: "
                                 f"{first[1].strip().splitlines()[-1]}")
