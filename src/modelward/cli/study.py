"""`modelward study plasticity CONFIG --out DIR` — the shallow-vs-deep adversarial-training study (seed 004 §5.4)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from modelward.cli._device import DEVICE_HELP, require_device, with_device
from modelward.cli._outdir import check_out_dir, refuse_other_config
from modelward.core.config import load_config
from modelward.core.progress import RichProgress
from modelward.robustness.plasticity import PlasticityConfig, run_study, table_markdown

app = typer.Typer(no_args_is_help=True)
console = Console()


@app.command()
def plasticity(
    config: Path = typer.Argument(..., help="TOML study config (see examples/plasticity.toml)."),
    out: Path = typer.Option(..., "--out", help="Output folder; rerun with the same folder to resume."),
    set_: list[str] = typer.Option([], "--set", help="Override a config field, e.g. --set adv_epochs=5."),
    device: str | None = typer.Option(None, "--device", help=DEVICE_HELP),
    workers: int = typer.Option(1, "--workers", min=1, help="runs in parallel (local executor)"),
    executor: str = typer.Option("local", "--executor", help="local | process | ray"),
    address: str | None = typer.Option(None, "--address", help="Ray cluster address (with --executor ray)"),
) -> None:
    """Train shallow / deep / parameter-matched models clean, then with PGD adversarial training (Table 5.1)."""
    cfg = load_config(config, PlasticityConfig, with_device(set_, device))
    require_device(cfg.device)
    check_out_dir(out)
    # before config.json is rewritten: a refused run must not replace the config of the results in the folder;
    # the device is left out (a study may resume on another device)
    recorded = json.loads(json.dumps(cfg.model_dump(mode="json", exclude={"device"})))
    refuse_other_config(out, "config.json", recorded, ("ledger.sqlite",))
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
    with RichProgress(console) as progress:
        rows = run_study(cfg, out, progress, workers=workers, executor=executor, address=address)
    console.print(table_markdown(rows, cfg))
    console.print(f"wrote {out / 'results.csv'}, {out / 'results.md'}, {out / 'plasticity.png'}")
