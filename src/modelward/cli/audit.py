"""`modelward audit verify LOG [--against OTHER_LOG]` and `modelward audit head LOG`: hash-chained audit logs."""

# lazy-imports: commands import the library on call, so `modelward --help` and this group's --help stay fast
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
    head: Annotated[str | None, typer.Option("--head", help="a head hash the party published (e.g. the driver's "
                                                           "summary.json audit_heads)")] = None,
    against: Annotated[Path | None, typer.Option("--against", help="another party's audit log: every head of "
                                                                    "LOG's party anchored there must still be in "
                                                                    "LOG (catches a truncated or rewritten tail)")]
    = None,
) -> None:
    """Print OK, or the first record that was edited, deleted, inserted, reordered or cut off (exit code 1)."""
    from modelward.governance.audit import verify as check
    from modelward.governance.audit import verify_against

    if head is not None:
        r = check(log, head)
        if not r.ok or against is None:
            console.print(str(r), highlight=False)
            if not r.ok:
                raise typer.Exit(1)
            return
    r = verify_against(log, against) if against is not None else check(log)
    console.print(str(r), highlight=False)
    if not r.ok:
        raise typer.Exit(1)


@app.command("head")
def head_cmd(log: Annotated[Path, typer.Argument(help="the party's audit SQLite file")]) -> None:
    """Print the party, the number of records and the head hash of LOG (what its peers anchor)."""
    from modelward.governance.audit import head_of

    h = head_of(log)
    console.print(f"{h['party']} {h['records']} {h['head']}", highlight=False)
