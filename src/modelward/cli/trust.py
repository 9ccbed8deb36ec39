"""`modelward trust allow|revoke|list`: the operator's list of config files whose code (entry points) may run.

A config cannot authorise its own code (issue 37 item 3); as ``direnv allow`` does for an ``.envrc``, ``modelward
trust allow CONFIG`` records the file's SHA-256 in the operator's own folder (:func:`~modelward.core.entrypoints.
trust_dir`), and editing the file revokes it. ``--trust-code`` (one command) and ``MODELWARD_TRUST_CODE=1`` (the
environment) are the other two ways.
"""

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
    """Trust the code (entry points) that config files name: your own list, never the files' say."""


@app.command("allow")
def allow(config: Annotated[Path, typer.Argument(help="the config file whose entry points you trust")]) -> None:
    """Record CONFIG's current contents as trusted (its SHA-256; editing the file revokes it)."""
    from modelward.core.entrypoints import TRUST_LIST, allow_config, trust_dir

    digest = allow_config(config)
    console.print(f"trusted {config} (sha256 {digest[:16]}…) in {trust_dir() / TRUST_LIST}; the entry points it "
                  "names may run until the file changes", highlight=False)


@app.command("revoke")
def revoke(config: Annotated[Path, typer.Argument(help="a config file in the trust list")]) -> None:
    """Remove CONFIG from the trust list (every recorded version of it)."""
    from modelward.core.entrypoints import revoke_config

    n = revoke_config(config)
    console.print(f"removed {n} entr{'y' if n == 1 else 'ies'} for {config}" if n else f"{config} was not trusted",
                  highlight=False)


@app.command("list")
def list_cmd() -> None:
    """Print the trust list: path, whether the file still matches, when it was allowed."""
    from modelward.core.entrypoints import TRUST_LIST, allowed_configs, trust_dir

    rows = allowed_configs()
    if not rows:
        console.print(f"no trusted configs ({trust_dir() / TRUST_LIST})", highlight=False)
    for r in rows:
        console.print(f"{r['state']:<22} {r['path']}  (sha256 {r['sha256'][:16]}…, allowed {r['allowed']})",
                      highlight=False)
