"""`modelward parts`: list a model's parts with parameter counts (seed 000 App. B)."""

# lazy-imports: commands import the library on call, so `modelward --help` and this group's --help stay fast
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ConfigDict
from rich.console import Console
from rich.table import Table

from modelward.core.config import StrictModel, load_config
from modelward.core.data import DataConfig
from modelward.core.zoo import ModelConfig

console = Console()


class PartsFile(StrictModel):
    """A TOML with [model] and either [data] or an explicit input shape; other tables (a study's) are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: ModelConfig = ModelConfig()
    data: DataConfig | None = None
    input_shape: list[int] | None = None
    num_classes: int | None = None


def register(app: typer.Typer) -> None:
    @app.command("parts")
    def parts(
        model: Annotated[Path, typer.Option(
            "--model", help="TOML file with a \\[model] table (a study file works; its other tables are ignored)")],
        set_: Annotated[list[str] | None, typer.Option("--set", help="override key=value")] = None,
        csv_out: Annotated[Path | None, typer.Option("--csv", help="also write the table as CSV")] = None,
    ) -> None:
        """Print each part of the model with its parameter count."""
        from modelward.core.parts import parts_table
        from modelward.core.zoo import build_model

        cfg = load_config(model, PartsFile, set_)
        if cfg.input_shape:
            shape, ncls = tuple(cfg.input_shape), cfg.num_classes or 10
        else:
            from modelward.core.data import load_data

            d = load_data(cfg.data or DataConfig())
            shape, ncls = d.input_shape, cfg.num_classes or d.num_classes
        net = build_model(cfg.model, shape, ncls)
        rows = parts_table(net)
        t = Table(title=f"{cfg.model.arch} (width {cfg.model.width}) on input {shape}, {ncls} classes")
        t.add_column("part")
        t.add_column("parameters", justify="right")
        t.add_column("excl. norm layers", justify="right")
        for r in rows:
            excl = r["params_excl_norm"]
            t.add_row(str(r["part"]), f"{r['params']:,}", "" if excl is None else f"{excl:,}")
        console.print(t)
        if csv_out:
            from modelward.core.records import write_csv

            write_csv(csv_out, rows, ["part", "params", "params_excl_norm"])
