"""`modelward complete run|report`: model-completion hardness studies."""

# lazy-imports: commands import the library on call, so `modelward --help` and this group's --help stay fast
from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from modelward.cli._device import DeviceOption

app = typer.Typer(no_args_is_help=True)
console = Console()


@app.command("run")
def run(
    study: Annotated[Path, typer.Argument(help="study TOML (see examples/completion_*.toml)")],
    out: Annotated[Path, typer.Option("--out", help="output folder (re-run the same command to resume)")],
    workers: Annotated[int | None, typer.Option("--workers", min=1, help="parallel processes (default: cores)")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="override key=value, e.g. seeds=[0,1]")] = None,
    executor: Annotated[str, typer.Option("--executor", help="local | process | ray")] = "local",
    address: Annotated[str | None, typer.Option("--address", help="Ray cluster address (--executor ray; "
                                                                    "default: a private local Ray)")] = None,
    device: DeviceOption = None,
) -> None:
    """Run (or resume) a completion study and write hardness tables and plots."""
    from modelward.cli._device import require_device, with_device
    from modelward.cli._outdir import check_out_dir
    from modelward.completion.study import interrupted_runs, load_study, run_study
    from modelward.core.progress import RichProgress

    cfg = load_study(study, with_device(set_, device))
    require_device(cfg.device)  # "auto" is resolved again by each worker (a Ray node may have its own GPU)
    check_out_dir(out)
    recovered = interrupted_runs(out)
    if recovered:
        console.print(f"[yellow]resuming:[/] {recovered} interrupted run(s) will restart")
    with RichProgress(console) as progress:
        outcome = run_study(cfg, out, progress, workers=workers or os.cpu_count(), executor=executor, address=address)
    _print_summary(cfg, outcome.tables, out)
    if outcome.failed:
        console.print(f"[red]{len(outcome.failed)} run(s) failed[/] (they restart when you run the command again):")
        for rid, err in sorted(outcome.failed.items())[:10]:
            console.print(f"  {rid}: {err.splitlines()[-1] if err else ''}")
        raise typer.Exit(1)


@app.command("report")
def report(out: Annotated[Path, typer.Argument(help="a study output folder")]) -> None:
    """Rebuild hardness.csv / hardness.md / plots from a study folder's run files."""
    from modelward.completion.config import read_study_config
    from modelward.completion.report import write_report

    tables = write_report(out)
    cfg = read_study_config(out)
    _print_summary(cfg, tables, out)


def _print_summary(cfg, tables, out: Path) -> None:  # type: ignore[no-untyped-def]
    from modelward.completion.report import rich_tables

    for table in rich_tables(cfg, tables):
        console.print(table)
    if tables.filtered:
        console.print(f"filtered (no better than untrained/random; excluded): {', '.join(tables.filtered)}")
    console.print(f"tables: {out / 'hardness.md'}  csv: {out / 'hardness.csv'}  plots: {out}/hardness_*.png")
