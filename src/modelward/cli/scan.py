"""`modelward scan PATH...`: examine model files without loading them; exit 1 when a scanned file is not clean
(with --strict also when a file could not be scanned)."""

# lazy-imports: commands import the library on call, so `modelward --help` and this group's --help stay fast
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("scan")
    def scan_cmd(
        paths: Annotated[list[Path], typer.Argument(help="model files or folders (.pt .pth .bin .ckpt .pkl "
                                                         ".safetensors .zip .npy ...)")],
        fmt: Annotated[str, typer.Option("--format", help="text | json | sarif")] = "text",
        out: Annotated[Path | None, typer.Option("--out", help="write the json/sarif output here")] = None,
        strict: Annotated[bool, typer.Option("--strict", help="also exit 1 when a file could not be scanned "
                                             "(unknown format, or its reader not installed)")] = False,
    ) -> None:
        """Scan pickle/zip checkpoints and safetensors headers for code that would run on loading (OWASP ML06)."""
        import json

        from rich.console import Console
        from rich.markup import escape

        from modelward.errors import ConfigError
        from modelward.scan import scan_exit_code, scan_paths

        if fmt not in ("text", "json", "sarif"):
            raise ConfigError(f"--format {fmt!r}: expected one of text, json, sarif")
        scans = scan_paths(paths)
        if fmt == "text":
            console = Console()
            for s in scans:
                state = ("[green]clean[/]" if s.clean else f"[red]{s.severity}[/]" if s.scanned else
                         "[yellow]not scanned[/]")
                console.print(f"{escape(s.path)}: {state} ({s.format}, sha256 {s.sha256[:12]}…)", highlight=False)
                for i in s.issues:
                    console.print(f"  {i.severity}: {escape(i.detail)} [{escape(i.where)}]", highlight=False)
            n_unsafe, n_skipped = sum(s.unsafe for s in scans), sum(not s.scanned for s in scans)
            console.print(f"{len(scans)} file(s): {len(scans) - n_unsafe - n_skipped} clean, {n_unsafe} not clean, "
                          f"{n_skipped} not scanned" + (" (--strict: a failure)" if strict and n_skipped else ""))
        else:
            if fmt == "json":
                text = json.dumps([s.to_dict() for s in scans], indent=2)
            else:
                from modelward.assess.findings import scan_findings
                from modelward.assess.sarif import to_sarif

                text = json.dumps(to_sarif([f for s in scans for f in scan_findings(s)]), indent=2)
            if out is None:
                typer.echo(text)
            else:
                out.write_text(text)
        code = scan_exit_code(scans, strict)
        if code:
            raise typer.Exit(code)
