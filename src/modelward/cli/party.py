"""`modelward party`: make mutual-TLS certificates and run a party server."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

app = typer.Typer(no_args_is_help=True)
console = Console()


@app.command("certs")
def certs(
    out: Annotated[Path, typer.Option("--out", help="folder for ca.pem and <party>.pem/.key")],
    parties: Annotated[str, typer.Option("--parties", help="comma-separated party names, e.g. alice,bob")],
    hosts: Annotated[str, typer.Option("--hosts", help="extra host names / IPs for the certificates")] = "",
    days: Annotated[int, typer.Option("--days", help="validity in days")] = 365,
) -> None:
    """Make a small CA and one certificate + key per party (valid for server and client use)."""
    from modelward.governance.certs import make_certs

    names = [p.strip() for p in parties.split(",") if p.strip()]
    paths = make_certs(out, names, [h.strip() for h in hosts.split(",") if h.strip()], days)
    console.print(f"CA {paths['ca']}; certificates for {', '.join(names)} in {out} (keys are mode 0600)")


@app.command("serve")
def serve(
    config: Annotated[Path, typer.Argument(help="PARTY.toml")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="override key=value")] = None,
) -> None:
    """Serve this party's segment over gRPC with mutual TLS until SIGTERM / Ctrl-C."""
    from modelward.governance.config import load_party_config
    from modelward.governance.server import serve as run

    cfg = load_party_config(config, set_)
    run(cfg, log=lambda s: print(s, flush=True))
    # state is saved and the audit log closed: skip the slow interpreter teardown of torch/grpc threads
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":  # the launcher starts servers this way: lighter than importing every command group
    app()
