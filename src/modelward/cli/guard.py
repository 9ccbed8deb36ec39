"""`modelward guard`: serve a model behind a prediction-perturbation defense (KServe v2 over HTTP); manage its keys."""

# lazy-imports: commands import the library on call, so `modelward --help` and this group's --help stay fast
from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True)
keys_app = typer.Typer(no_args_is_help=True, help="list, add, revoke API keys and reset budgets (also while serving)")
app.add_typer(keys_app, name="keys")


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
    from modelward.extraction.guard.keys import placeholder_keys
    from modelward.extraction.guard.service import build_service

    svc = build_service(config, set_, check_only=True)
    meta = svc.metadata()
    typer.echo(f"model {meta['name']}: input {meta['inputs'][0]['shape']}, {svc.num_classes} classes; "
               f"defense {svc.defense.name} {svc.defense.params()}; {len(svc.keys)} key(s)")
    if svc.changes:
        typer.echo(f"note: {svc.state_dir} was built with other settings ({'; '.join(svc.changes)}); "
                   "'guard serve' refuses them unless given --reset")
    _check_upstream(svc)
    bad = placeholder_keys(svc.cfg)
    if bad:
        typer.echo(f"note: keys {bad} are placeholders from the examples; 'guard serve' refuses them: put a secret "
                   "in each key, or use 'modelward guard keys add'")
    svc.close()


def _check_upstream(svc) -> None:  # noqa: ANN001 - a GuardService (imported lazily)
    """Proxy mode: say whether the model server answers and serves what [model] says."""
    from modelward.extraction.guard.errors import GuardError
    from modelward.extraction.guard.proxy import UpstreamModel

    if not isinstance(svc.model, UpstreamModel):
        return
    where = f"{svc.model.cfg.url}{svc.model.client.model_path}"
    try:
        problems = svc.model.check()
    except GuardError as e:
        typer.echo(f"note: proxy mode: the upstream {where} does not answer now ({e.message})")
        return
    finally:
        svc.model.close()
    typer.echo(f"upstream {where} ({svc.model.cfg.output}): "
               + ("serves what [model] says" if not problems else "DISAGREES: " + "; ".join(problems)))


@keys_app.command("list")
def keys_list(config: Path = typer.Argument(..., help="GUARD.toml")) -> None:
    """Every key (from the config and added here): budget, rows used, revoked; never the key itself."""
    from modelward.extraction.guard.keys import list_keys

    typer.echo(f"{'name':<24} {'source':<7} {'used':>10} {'budget':>10} revoked")
    for k in list_keys(config):
        typer.echo(f"{k.name:<24} {k.source:<7} {k.used:>10} {'-' if k.budget is None else k.budget:>10} "
                   f"{'yes' if k.revoked else 'no'}")


@keys_app.command("add")
def keys_add(config: Path = typer.Argument(..., help="GUARD.toml"),
             name: str = typer.Argument(..., help="the new key's name (shown in the query log)"),
             budget: int = typer.Option(None, "--budget", help="rows the key may query (default: unlimited)")) -> None:
    """Make a new random API key (printed once; the guard stores only its SHA-256)."""
    from modelward.extraction.guard.keys import add_key

    key = add_key(config, name, budget)
    typer.echo(f"added key {name!r} (budget {'unlimited' if budget is None else budget}); the key, shown once:")
    typer.echo(key)


@keys_app.command("revoke")
def keys_revoke(config: Path = typer.Argument(..., help="GUARD.toml"),
                name: str = typer.Argument(..., help="the key's name")) -> None:
    """Refuse a key from now on (a running server within 2 s); its usage is kept."""
    from modelward.extraction.guard.keys import revoke_key

    revoke_key(config, name)
    typer.echo(f"revoked key {name!r}")


@keys_app.command("reset-budget")
def keys_reset_budget(config: Path = typer.Argument(..., help="GUARD.toml"),
                      name: str = typer.Argument(..., help="the key's name"),
                      used: int = typer.Option(0, "--used", help="rows to count as used (default 0)")) -> None:
    """Set the rows a key has used (0: its whole budget is available again)."""
    from modelward.extraction.guard.keys import reset_budget

    reset_budget(config, name, used)
    typer.echo(f"key {name!r}: {used} row(s) used")


@app.command()
def fingerprint(config: Path = typer.Argument(..., help="GUARD.toml with [ownership.fingerprint] data = {...}"),
                set_: list[str] = typer.Option(None, "--set", help="override a config value")) -> None:
    """Make the served model's boundary fingerprint (trains independent reference models) into server.state_dir."""
    from modelward.core.progress import RichProgress
    from modelward.extraction.guard.proof import make_guard_fingerprint

    with RichProgress() as progress:
        path, fp = make_guard_fingerprint(config, set_, progress=progress)
    refs = fp.reference_agreement
    typer.echo(f"fingerprint: {len(fp)} points in {path}; independent references agreed with the owner on "
               f"{min(refs):.0%}–{max(refs):.0%} of them")


@app.command()
def verify(config: Path = typer.Argument(..., help="GUARD.toml of the guard whose answers may have been stolen"),
           suspect: str = typer.Option(..., "--suspect", help="a safetensors checkpoint (the guarded architecture) "
                                       "or an Open Inference Protocol URL, http://host:port/v2/models/NAME"),
           suspect_model: str | None = typer.Option(None, "--suspect-model", help="model name on the suspect URL"),
           api_key: str | None = typer.Option(None, "--api-key", envvar="MODELWARD_SUSPECT_KEY",
                                              help="bearer key for the suspect URL"),
           level: float = typer.Option(1e-6, help="decision level for 'derived from this model'"),
           max_rows: int | None = typer.Option(None, "--max-rows", help="query at most this many watermark rows"),
           labels_only: bool = typer.Option(False, "--labels-only", help="use only the suspect's top-1 labels"),
           out: Path | None = typer.Option(None, "--out", help="write the report as JSON here"),
           set_: list[str] = typer.Option(None, "--set", help="override a config value")) -> None:
    """Test a suspect model for this guard's answer watermark and this model's fingerprint; exit 1 if derived."""
    from modelward.core.records import atomic_write_json
    from modelward.extraction.guard.proof import verify_suspect

    rep = verify_suspect(config, suspect, overrides=set_, level=level, max_watermark_rows=max_rows,
                         model_name=suspect_model, api_key=api_key, labels_only=labels_only)
    for e in rep.evidence:
        typer.echo(f"{e.method:<11} p = {e.p_value:.3g}  ({e.matches}/{e.n} matches: {e.statistic}; "
                   f"{e.queries} queries; null {e.null})")
    verdict = "DERIVED from this model" if rep.derived else "not shown to be derived"
    typer.echo(f"verdict: {verdict} (combined p = {rep.p_value:.3g}, level {level:g}, {rep.queries} queries)")
    if out is not None:
        atomic_write_json(out, rep.to_dict())
    raise typer.Exit(1 if rep.derived else 0)
