"""`modelward assess CONFIG --out DIR`: every threat area on one model, one self-contained HTML report (and its
findings as JSON and SARIF); `modelward assess diff OLD NEW [--fail-on robustness:-5,privacy:+2]` compares two."""

# lazy-imports: commands import the library on call, so `modelward --help` and this group's --help stay fast
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

FORMATS = ("html", "json", "sarif")


def _diff(args: list[str]) -> int:
    """`modelward assess diff OLD NEW [--fail-on ...] [--format text|json]` (parsed here: `assess` takes a CONFIG)."""
    diff_app = typer.Typer(add_completion=False)

    @diff_app.command()
    def diff(
        old: Annotated[Path, typer.Argument(help="the earlier assessment folder (or its report.json)")],
        new: Annotated[Path, typer.Argument(help="the later assessment folder (or its report.json)")],
        fail_on: Annotated[str | None, typer.Option("--fail-on", help="SECTION:±X,...: exit 1 when a rated metric "
                                                    "moved significantly by X or more (points for rates)")] = None,
        fmt: Annotated[str, typer.Option("--format", help="text | json")] = "text",
    ) -> None:
        import json
        from dataclasses import asdict

        from rich.markup import escape
        from rich.table import Table

        from modelward.assess.diff import diff_reports
        from modelward.assess.findings import fmt_value

        changes = diff_reports(old, new, fail_on)
        gated = [c for c in changes if c.gated]
        if fmt == "json":
            typer.echo(json.dumps({"changes": [asdict(c) for c in changes], "failed": [c.gated for c in gated]},
                                  indent=2))
        else:
            console = Console(width=200)
            t = Table(title=f"{old} → {new}")
            for col in ("section", "metric", "old", "new", "change", "95 % CI of the change", "interval",
                        "significant", "gate"):
                t.add_column(col)
            for c in changes:
                unit = " pts" if c.unit in ("fraction", "auc") else ""
                t.add_row(c.section, escape(c.label), fmt_value(c.old, c.unit), fmt_value(c.new, c.unit),
                          "–" if c.delta is None else f"{c.delta:+.2f}{unit}",
                          "–" if not c.delta_ci else f"{c.delta_ci[0]:+.2f} … {c.delta_ci[1]:+.2f}",
                          escape(c.interval),
                          ("yes, riskier" if c.riskier else "yes, safer") if c.significant else "no",
                          f"[red]FAILED {c.gated}[/]" if c.gated else "")
            console.print(t)
            console.print(f"{sum(c.significant for c in changes)} significant change(s), {len(gated)} past "
                          "the --fail-on thresholds")
        if gated:
            raise typer.Exit(1)

    return int(typer.main.get_command(diff_app).main(args, prog_name="modelward assess diff",
                                                     standalone_mode=False) or 0)


def register(app: typer.Typer) -> None:
    @app.command("assess", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def assess_cmd(
        ctx: typer.Context,
        config: Annotated[Path, typer.Argument(help="TOML: checkpoint, optional \\[model], \\[data], \\[split]; or "
                                               "`diff OLD NEW [--fail-on robustness:-5,privacy:+2]`")],
        out: Annotated[Path | None, typer.Option("--out", help="output folder (report.html, report.json, "
                                                 "sections)")] = None,
        profile: Annotated[str | None, typer.Option("--profile", help="quick | standard | thorough")] = None,
        executor: Annotated[str, typer.Option("--executor", help="local | process | ray")] = "local",
        address: Annotated[str | None, typer.Option("--address", help="Ray cluster address (with --executor ray)")]
        = None,
        workers: Annotated[int, typer.Option("--workers", min=1, help="sections run in parallel (local)")] = 1,
        device: Annotated[str | None, typer.Option("--device", help="auto | cpu | cuda | cuda:N | mps")] = None,
        set_: Annotated[list[str] | None, typer.Option("--set", help="override key=value")] = None,
        retry: Annotated[bool, typer.Option("--retry", help="also re-run sections recorded as not assessed "
                                            "(failed sections are always re-run)")] = False,
        fmt: Annotated[str, typer.Option("--format", help="html | json | sarif: also print report.json or write "
                                         "report.sarif (report.html and report.json are always written)")] = "html",
    ) -> None:
        """Assess a model's robustness, privacy, extraction risk, completion hardness, explanations and bias;
        `modelward assess diff OLD NEW --fail-on robustness:-5` compares two assessments (exit 1 past a gate)."""
        from modelward.errors import ConfigError

        if str(config) == "diff" and not config.exists():
            code = _diff(list(ctx.args) + (["--format", fmt] if fmt != "html" else []))  # --format is parsed here
            if code:
                raise typer.Exit(code)
            return
        if ctx.args:
            raise ConfigError(f"modelward assess: unexpected argument(s) {ctx.args}")
        if out is None:
            raise ConfigError("modelward assess CONFIG: --out DIR is required (the assessment folder)")
        if fmt not in FORMATS:
            raise ConfigError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
        from modelward.assess import AssessConfig, run_assessment
        from modelward.cli._outdir import check_out_dir
        from modelward.core.config import load_config
        from modelward.core.progress import RichProgress

        console = Console()
        overrides = list(set_ or [])
        if profile is not None:
            overrides.append(f"profile={profile}")
        if device is not None:
            overrides.append(f"device={device}")
        cfg = load_config(config, AssessConfig, overrides).resolve_paths(config.resolve().parent)
        check_out_dir(out)
        with RichProgress(console) as progress:
            outcome = run_assessment(cfg, out, workers=workers, executor=executor, address=address,
                                     progress=progress, retry=retry)
        report = out.resolve() / "report.html"
        import json

        data = json.loads((out / "report.json").read_text())
        for w in data.get("warnings", []):
            console.print(f"[yellow]warning:[/] {w}", highlight=False)
        for s in data["sections"]:
            head = s["headline"]["text"] + " — " + s["headline"]["label"] if s.get("headline") else s["reason"]
            console.print(f"  {s['title']}: [bold]{s['verdict']}[/] ({head})", highlight=False)
        if fmt == "sarif":
            console.print(f"sarif: {out.resolve() / 'report.sarif'}")
        elif fmt == "json":
            typer.echo(json.dumps(data.get("findings", []), indent=2))
        console.print(f"report: {report}")
        failed = [s["section"] for s in data["sections"] if s["status"] == "failed"]
        if outcome.failed or failed:
            console.print(f"[red]{len(failed) or len(outcome.failed)} section(s) failed ({', '.join(failed)}); "
                          "fix the cause and re-run the same command to retry them[/]")
            raise typer.Exit(1)
