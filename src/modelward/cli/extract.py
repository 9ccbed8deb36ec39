"""`modelward extract`: model-extraction evaluations against defended victims (thin: parse, call, print)."""

# lazy-imports: commands import the library on call, so `modelward --help` and this group's --help stay fast
from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from modelward.cli._device import DEVICE_HELP, require_device, with_device
from modelward.cli._outdir import check_out_dir
from modelward.core.config import load_config

app = typer.Typer(no_args_is_help=True, help="Model-extraction attacks against defended victims.")
console = Console()


@app.command("run")
def run(
    config: Path = typer.Argument(..., help="Evaluation TOML (see examples/extraction_digits.toml)."),
    out: Path = typer.Option(..., "--out", help="Run directory (resumable: rerun to finish the missing cells)."),
    set_: list[str] = typer.Option(None, "--set", help="Override a config value, e.g. budget=300."),
    device: str | None = typer.Option(None, "--device", help=DEVICE_HELP),
    workers: int = typer.Option(1, "--workers", min=1, help="runs in parallel (local executor)"),
    executor: str = typer.Option("local", "--executor", help="local | process | ray"),
    address: str | None = typer.Option(None, "--address", help="Ray cluster address (with --executor ray)"),
) -> None:
    """Run every defense × ε × attack × seed cell; write results.csv, worst_case.csv, results.md and plots."""
    from modelward.core.progress import RichProgress
    from modelward.extraction.config import ExtractionConfig
    from modelward.extraction.study import run_evaluation

    cfg = load_config(config, ExtractionConfig, with_device(set_, device))
    require_device(cfg.device)
    check_out_dir(out)
    with RichProgress(console) as progress:
        summary = run_evaluation(cfg, out, progress, workers=workers, executor=executor, address=address)
    console.print(f"victim: test accuracy {summary['victim_accuracy']:.4f} "
                  f"({'cached' if summary['victim_cached'] else 'trained'}), pool {summary['pool']}, budget "
                  f"{cfg.budget}; {summary['already_done']}/{summary['cells']} cells already done")
    table = Table(title=f"{cfg.name}: worst case over attacks (victim accuracy {summary['victim_accuracy']:.2%})")
    for col in ("defense", "max accuracy", "worst attack", "max fidelity", "max ℓ1", "protected acc."):
        table.add_column(col)
    for r in summary["worst_case"]:
        table.add_row(r["defense"], f"{r['max_accuracy']:.2%}", r["worst_attack"], f"{r['max_fidelity']:.2%}",
                      f"{r['max_l1']:.2f}", f"{r['protected_accuracy']:.2%}")
    console.print(table)
    console.print(f"wrote {out}/results.md, results.csv, worst_case.csv")


@app.command("attacks")
def attacks() -> None:
    """List the query strategies and attack strategies."""
    from modelward.extraction.attacks import ADAPTIVE, ATTACK_STRATEGIES, QUERY_STRATEGIES

    console.print("query strategies: " + ", ".join(sorted(QUERY_STRATEGIES)))
    console.print("attack strategies: " + ", ".join(
        f"{k}{' (adaptive: needs the defense)' if k in ADAPTIVE else ''}" for k in sorted(ATTACK_STRATEGIES)))
