"""`modelward audit verify LOG`: check a party's hash-chained audit log."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

app = typer.Typer(no_args_is_help=True)
console = Console()


@app.callback()
def _group() -> None:
    """Verify hash-chained audit logs."""


@app.command("verify")
def verify(
    log: Annotated[Path, typer.Argument(help="the party's audit SQLite file")],
    head: Annotated[str | None, typer.Option("--head", help="the head hash the party published (summary.json)")]
    = None,
) -> None:
    """Print OK, or the first record that was edited, deleted, inserted or reordered (exit code 1)."""
    from modelward.governance.audit import verify as check

    r = check(log, head)
    console.print(str(r), highlight=False)
    if not r.ok:
        raise typer.Exit(1)
