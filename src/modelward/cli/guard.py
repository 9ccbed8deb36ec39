"""`modelward guard`: serve a model behind a prediction-perturbation defense (KServe v2 over HTTP)."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True)


@app.command()
def serve(config: Path = typer.Argument(..., help="GUARD.toml (see examples/guard_*.toml)"),
          host: str = typer.Option(None, help="override server.host"),
          port: int = typer.Option(None, help="override server.port"),
          set_: list[str] = typer.Option(None, "--set", help="override a config value, e.g. defense.params.epsilon=0.5"),
          reset: bool = typer.Option(False, "--reset", help="start a new defense state when the settings differ "
                                     "from the ones server.state_dir was built with (keeps the query log)"),
          device: str | None = typer.Option(None, "--device", help="where the model answers: auto | cpu | cuda | "
                                            "cuda:N | mps (default: model.device, else cpu)"),
          ) -> None:
    """Serve the configured model, guarded by the configured defense, until interrupted."""
    from modelward.cli._device import require_device, with_device
    from modelward.extraction.guard.http import serve as run

    if device is not None:
        require_device(device)  # refused before the config, the model or the port are touched
    run(config, host=host, port=port, overrides=with_device(set_, device, "model.device"), reset=reset)


@app.command()
def check(config: Path = typer.Argument(..., help="GUARD.toml"),
          set_: list[str] = typer.Option(None, "--set", help="override a config value")) -> None:
    """Load the config, model and defense without serving; print what would be served."""
    from modelward.extraction.guard.service import build_service

    svc = build_service(config, set_, check_only=True)
    meta = svc.metadata()
    typer.echo(f"model {meta['name']}: input {meta['inputs'][0]['shape']}, {svc.num_classes} classes; "
               f"defense {svc.defense.name} {svc.defense.params()}; {len(svc.keys)} key(s)")
    if svc.changes:
        typer.echo(f"note: {svc.state_dir} was built with other settings ({'; '.join(svc.changes)}); "
                   "'guard serve' refuses them unless given --reset")
    svc.close()
