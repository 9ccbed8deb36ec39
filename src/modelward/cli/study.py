"""`modelward study plasticity CONFIG --out DIR` — the shallow-vs-deep adversarial-training study (seed 004 §5.4)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import typer
from rich.console import Console

from modelward.cli._outdir import check_out_dir, refuse_other_config
from modelward.core.config import dump_config, load_config
from modelward.core.plots import grouped_bars
from modelward.core.progress import make_progress
from modelward.robustness.plasticity import (
    METRICS,
    PlasticityConfig,
    run_ids,
    run_study,
    summarise,
    table_markdown,
)

app = typer.Typer(no_args_is_help=True)
console = Console()


@app.command()
def plasticity(
    config: Path = typer.Argument(..., help="TOML study config (see examples/plasticity.toml)."),
    out: Path = typer.Option(..., "--out", help="Output folder; rerun with the same folder to resume."),
    set_: list[str] = typer.Option([], "--set", help="Override a config field, e.g. --set adv_epochs=5."),
) -> None:
    """Train shallow / deep / parameter-matched models clean, then with PGD adversarial training (Table 5.1)."""
    cfg = load_config(config, PlasticityConfig, set_)
    check_out_dir(out)
    # before config.json is rewritten: a refused run must not replace the config of the results in the folder
    refuse_other_config(out, "config.json", json.loads(json.dumps(cfg.model_dump(mode="json"))), ("ledger.sqlite",))
    out.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, out / "config.json")
    with make_progress(console) as progress:
        overall = progress.add_task("plasticity", total=len(run_ids(cfg)), info="")
        current: dict[str, int] = {}

        def on_progress(rid: str, step: int, total: int) -> None:
            if rid not in current:
                current[rid] = progress.add_task(rid, total=total, info="")
                progress.advance(overall) if len(current) > 1 else None
            progress.update(current[rid], completed=step)

        rows = run_study(cfg, out, on_progress)
        progress.update(overall, completed=len(run_ids(cfg)))
    keys = list(rows[0].keys()) if rows else []
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    md = table_markdown(rows, cfg)
    (out / "results.md").write_text("# Plasticity study (seed 004 §5.4, Table 5.1 layout)\n\n" + md)
    s = summarise(rows)
    groups = [f"{m.name}\n{p}" for m in cfg.models for p in ("clean", "adversarial")]
    series = {title: ([s.get((g.split("\n")[0], g.split("\n")[1], key), (0.0, 0.0))[0] for g in groups],
                      [s.get((g.split("\n")[0], g.split("\n")[1], key), (0.0, 0.0))[1] for g in groups])
              for key, title in METRICS}
    grouped_bars(out / "plasticity.png", groups, series, "Plasticity study: before / after PGD training", "%",
                 (0.0, 100.0))
    console.print(md)
    console.print(f"wrote {out / 'results.csv'}, {out / 'results.md'}, {out / 'plasticity.png'}")
