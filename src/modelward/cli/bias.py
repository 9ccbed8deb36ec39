"""``modelward bias CONFIG --out DIR``: bias amplification and its mitigations (seed 002 Ch. 9).

Thin: load the TOML config, call :func:`modelward.bias.study.run_bias` (the shared study frame: resumable,
re-running continues; it writes ``results.csv/md/json`` — B and accuracy per data set and mitigation —
``theorem.*``, ``sweep.*`` and the plots) and print the tables.
"""

# lazy-imports: commands import the library on call, so `modelward --help` and this group's --help stay fast
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from modelward.cli._device import DeviceOption, with_device


def register(app: typer.Typer) -> None:
    @app.command("bias")
    def bias_cmd(
        config: Annotated[Path, typer.Argument(help="TOML with \\[\\[datasets]], \\[theorem] and/or \\[sweep] "
                                                    "(see examples/bias_*.toml)")],
        out: Annotated[Path, typer.Option("--out", help="study folder (re-running resumes it)")],
        set_: Annotated[list[str] | None, typer.Option("--set", help="override key=value, e.g. "
                                                                      "datasets.0.splits=5")] = None,
        workers: Annotated[int | None, typer.Option("--workers", help="parallel runs (default: config)")] = None,
        device: DeviceOption = None,
    ) -> None:
        """B_D(h) and accuracy before/after feature parity, experts and ℓ1; Theorem 9.1 vs Monte-Carlo; Fig. 9.3."""
        from modelward.bias.study import BiasConfig, run_bias
        from modelward.cli._outdir import check_out_dir
        from modelward.core.config import load_config
        from modelward.core.progress import RichProgress
        from modelward.errors import ModelwardError

        console = Console()
        cfg = load_config(config, BiasConfig, with_device(set_, device))
        check_out_dir(out)
        with RichProgress(console) as progress:
            outcome = run_bias(cfg, out, progress, workers=workers)
        tables = outcome.tables
        for r in tables["results"]:
            console.print(f"{r['dataset']:>16} {r['mitigation']:>8}  B {r['bias']:+.3f}  acc {r['acc']:.3f}  "
                          f"(p* {r['p']:.3f}, {r['splits']} splits)")
        for t in tables["theorem"]:
            console.print(f"Theorem 9.1 p={t['p']} D={t['D']}: {t['theorem']:.4f} vs MC {t['monte_carlo']:.4f} "
                          f"± {t['se']:.4f}")
        console.print(f"{outcome.done}/{outcome.total} runs done · wrote {len(outcome.written)} files in {out}")
        if outcome.failed:
            first = next(iter(outcome.failed.items()))
            raise ModelwardError(f"{len(outcome.failed)} run(s) failed (re-run to retry); first: {first[0]}: "
                                 f"{first[1].strip().splitlines()[-1]}")
