"""``modelward cost CONFIG --out DIR``: plain vs split vs HE vs MPC (vs CrypTen) on the same model and inputs."""

# lazy-imports: commands import the library on call, so `modelward --help` and this group's --help stay fast
from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console

console = Console()


def register(app: typer.Typer) -> None:
    @app.command("cost")
    def cost(config: Path = typer.Argument(..., help="TOML config (see examples/cost_*.toml)."),
             out: Path = typer.Option(..., "--out", help="Folder for results.csv/md/json and latency.png."),
             set_: list[str] = typer.Option([], "--set", help="Override a config value, e.g. --set cost.samples=8"),
             ) -> None:
        """Measure latency, throughput, bytes on the wire and agreement of every backend; one table + plot."""
        from modelward.cli._outdir import check_out_dir
        from modelward.core.config import load_config
        from modelward.cost.report import claims, write_results
        from modelward.cost.run import CostConfig, run_cost, table_rows

        cfg = load_config(config, CostConfig, set_)
        check_out_dir(out)
        out.mkdir(parents=True, exist_ok=True)
        from modelward.core.progress import RichProgress

        with RichProgress(console) as progress:
            results, info = run_cost(cfg, out / "work", progress=progress,
                                     log=lambda m: console.print(m, highlight=False))
        rows = table_rows(results, info)
        paths = write_results(out, rows, info, cfg.model_dump(mode="json"))
        for r in rows:
            sd = r["slowdown_sample"]
            console.print(f"  {r['backend']:8s} {r['status']:11s} "
                          + (f"{r['latency_sample_ms']:.3g} ms/sample  {sd:.3g}× plain  "
                             f"{r['bytes_per_sample']:.3g} B/sample  max|Δ| {r['max_abs_diff']:.2g}"
                             if r["status"] == "ok" else r["reason"][:160]), highlight=False)
        for c in claims(rows):
            console.print(f"  seed claim: {c['claim']}: measured {c['measured']:.3g} -> "
                          f"{'holds' if c['holds'] else ('not measured' if c['holds'] is None else 'does not hold')}",
                          highlight=False)
        console.print(f"wrote {paths['md']}, {paths['csv']}, {paths['json']}, {paths['plot']}")
        failed = [r for r in rows if r["status"] in ("FAILED", "error")
                  or str(r.get("train_note", "")).startswith("FAILED")]
        if failed:
            for r in failed:
                console.print(f"[bold red]FAILED[/] {r['backend']}: {r['reason'] or r['train_note']}", highlight=False)
            sys.exit(3)
