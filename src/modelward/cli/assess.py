"""`modelward assess CONFIG --out DIR`: every threat area on one model, one self-contained HTML report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console


def register(app: typer.Typer) -> None:
    @app.command("assess")
    def assess_cmd(
        config: Annotated[Path, typer.Argument(help="TOML: checkpoint, optional \\[model], \\[data], \\[split]")],
        out: Annotated[Path, typer.Option("--out", help="output folder (report.html, report.json, sections)")],
        profile: Annotated[str | None, typer.Option("--profile", help="quick | standard | thorough")] = None,
        executor: Annotated[str, typer.Option("--executor", help="local | process | ray")] = "local",
        address: Annotated[str | None, typer.Option("--address", help="Ray cluster address (with --executor ray)")]
        = None,
        workers: Annotated[int, typer.Option("--workers", min=1, help="sections run in parallel (local)")] = 1,
        device: Annotated[str | None, typer.Option("--device", help="auto | cpu | cuda | cuda:N | mps")] = None,
        set_: Annotated[list[str] | None, typer.Option("--set", help="override key=value")] = None,
    ) -> None:
        """Assess a model's robustness, privacy, extraction risk, completion hardness, explanations and bias."""
        from modelward.assess import AssessConfig, run_assessment
        from modelward.cli._outdir import check_out_dir
        from modelward.core.config import load_config
        from modelward.core.progress import RichProgress

        console = Console()
        overrides = list(set_ or [])
        if profile is not None:
            overrides.append(f"profile={profile}")
        if device is not None:
            overrides.append(f"device={device}")
        cfg = load_config(config, AssessConfig, overrides).resolve_paths(config.resolve().parent)
        check_out_dir(out)
        with RichProgress(console) as progress:
            outcome = run_assessment(cfg, out, workers=workers, executor=executor, address=address,
                                     progress=progress)
        report = out.resolve() / "report.html"
        import json

        for s in json.loads((out / "report.json").read_text())["sections"]:
            head = s["headline"]["text"] + " — " + s["headline"]["label"] if s.get("headline") else s["reason"]
            console.print(f"  {s['title']}: [bold]{s['verdict']}[/] ({head})", highlight=False)
        if outcome.failed:
            console.print(f"[yellow]{len(outcome.failed)} section run(s) failed; re-run to retry them[/]")
        console.print(f"report: {report}")
