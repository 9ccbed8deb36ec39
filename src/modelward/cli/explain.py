"""``modelward explain CONFIG --out DIR``: attribution tables and image grids (seed 002 Ch. 3).

Per model: input attributions of the true class by saliency / integrated gradients / SmoothGrad / gradient×input
(``<model>/attributions.*``, ``attributions.png``) and the most influential units of a slice per class, shown by
input attribution and by inversion (``<model>/top_units.*``, ``top_units_*.png``); across models: ``compare.*``.
Runs go through the shared runner: re-running the command resumes.
"""

from __future__ import annotations

import functools
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
        from modelward.core.config import dump_config, load_config
        from modelward.core.device import resolve_device
        from modelward.core.ledger import RunLedger
        from modelward.core.progress import RichProgress
        from modelward.core.runner import run_plan
        from modelward.errors import ModelwardError
        from modelward.explain.study import ExplainConfig, config_json, execute, plan

        console = Console()
        cfg = load_config(config, ExplainConfig, with_device(set_, device))
        resolve_device(cfg.device)  # an unusable device is refused before any run starts
        check_out_dir(out)
        out.mkdir(parents=True, exist_ok=True)
        ledger = RunLedger(out / "ledger.sqlite")
        ledger.bind_config(cfg, exclude={"device"})  # a study may resume on another device (docs/devices.md)
        dump_config(cfg, out / "config.json")
        run = functools.partial(execute, config=config_json(cfg), out=str(out.resolve()),
                                base=str(Path.cwd()))
        with RichProgress(console) as progress:
            outcome = run_plan(ledger, plan(cfg), run, progress=progress, description="explain runs")
        for rid, res in sorted(ledger.results().items()):
            console.print(f"{rid}: {res}")
        console.print(f"{outcome.done}/{outcome.total} runs done · results in {out}")
        if outcome.failed:
            first = next(iter(outcome.failed.items()))
            raise ModelwardError(f"{len(outcome.failed)} run(s) failed (re-run to retry); first: {first[0]}: "
                                 f"{first[1].strip().splitlines()[-1]}")
