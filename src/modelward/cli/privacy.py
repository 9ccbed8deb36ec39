"""``modelward privacy``: membership-inference audits, model inversion, property inference (seed 002 ch. 8, App.
C–D). Thin: parse the TOML config, call :mod:`modelward.privacy`, print a table."""

# lazy-imports: commands import the library on call, so `modelward --help` and this group's --help stay fast
from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from modelward.cli._device import DEVICE_HELP
from modelward.cli._outdir import check_out_dir
from modelward.core.config import load_config

app = typer.Typer(no_args_is_help=True, help="Membership inference, model inversion and property inference audits.")
console = Console()
SET_HELP = "Override a config value, e.g. --set repetitions=3 (repeatable)."


@app.command("audit")
def audit(
    config: Path = typer.Argument(..., help="Audit TOML (see examples/privacy_bcw.toml)."),
    out: Path = typer.Option(..., "--out", help="Study folder (resumable: re-run to finish missing runs)."),
    set_: list[str] = typer.Option(None, "--set", help=SET_HELP),
    workers: int = typer.Option(1, "--workers", min=1, help="Parallel runs (processes)."),
    executor: str = typer.Option("local", "--executor", help="Runner executor: local, sequential, process, ray."),
    device: str | None = typer.Option(None, "--device", help=DEVICE_HELP),
    guard: Path | None = typer.Option(None, "--guard", help="GUARD.toml: attack the model served by 'guard serve' "
                                      "over HTTP, once per defense (CONFIG: see examples/privacy_served_digits.toml)."),
) -> None:
    """Membership-inference audit: results.csv/md/json, targets.*, slices.*, exposed.*, roc.png, score arrays.
    With --guard: the defense × attack table through the served API (table.md)."""
    from modelward.cli._device import require_device, with_device
    from modelward.core.progress import RichProgress
    from modelward.privacy.audit import AuditConfig, run_audit

    if guard is not None:
        from modelward.privacy.served import ServedAuditConfig, run_served_audit

        scfg = load_config(config, ServedAuditConfig, set_)
        check_out_dir(out)
        with RichProgress(console) as progress:
            run_served_audit(scfg, guard, out, progress)
        console.print((out / "table.md").read_text())
        console.print(f"wrote {out}/table.md, results.md, results.csv, results.json, scores/, guards/")
        return

    cfg = load_config(config, AuditConfig, with_device(set_, device))
    require_device(cfg.device)
    check_out_dir(out)
    with RichProgress(console) as progress:
        rows = run_audit(cfg, out, workers=workers, executor=executor, progress=progress)
    table = Table(title=f"{cfg.name}: membership inference ({cfg.repetitions} repetition(s))")
    for col in ("attack", "accuracy", "advantage", "precision", "AUC", "TPR@0.1%FPR", "TPR@1%FPR",
                "ε_lb (95%)"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["attack"], f"{r['accuracy']:.3f}", f"{r['advantage']:.3f}", f"{r['precision']:.3f}",
                      f"{r['auc']:.3f}", f"{r['tpr_at_0_1pct_fpr']:.3f}", f"{r['tpr_at_1pct_fpr']:.3f}",
                      f"{r.get('epsilon_lb', float('nan')):.2f}")
    console.print(table)
    if cfg.defense.kind == "dp":
        import json

        for t in json.loads((out / "targets.json").read_text()):
            console.print(f"repetition {t['repetition']}: ε = {t['epsilon']:.3g} at δ = {t['delta']:.2g} "
                          f"({t['accountant']} accountant), test accuracy {t['test_accuracy']:.3f}; best attack "
                          f"advantage {t['best_attack_advantage']:.3f} vs (ε, δ) bound {t['bound_eps_delta']:.3f} "
                          f"({'within' if t['within_bound'] else 'ABOVE'})")
    slices = out / "slices.json"
    if slices.is_file():
        import json

        for s in json.loads(slices.read_text()):
            if s["worst"] and s["repetition"] == 0:
                console.print(f"{s['attack']}: worst slice {s['slice']} (TPR@1%FPR {s['tpr_at_1pct_fpr']:.3f}, "
                              f"AUC {s['auc']:.3f}, ε_lb {s['epsilon_lb']:.2f}; repetition 0)")
    console.print(f"wrote {out}/results.md, results.csv, results.json, targets.md, slices.md, exposed.md, roc.png, "
                  "scores/")


@app.command("audit-dp")
def audit_dp(
    config: Path = typer.Argument(..., help="DP audit TOML (see examples/privacy_dp_audit.toml)."),
    out: Path = typer.Option(..., "--out", help="Output folder (results.*, canary score arrays)."),
    set_: list[str] = typer.Option(None, "--set", help=SET_HELP),
) -> None:
    """One-run DP-SGD audit (Steinke et al. 2023): claimed ε (accountant named) vs audited ε lower bound."""
    from modelward.privacy.dp_audit import DPAuditConfig, run_dp_audit

    cfg = load_config(config, DPAuditConfig, set_)
    check_out_dir(out)
    with console.status("DP-SGD training with canaries (one run)"):
        rows = run_dp_audit(cfg, out)
    table = Table(title=f"{cfg.name}: one-run DP audit (seed {cfg.seed})")
    for col in ("canaries", "claimed ε", "accountant", "δ", f"audited ε ≥ ({cfg.confidence:.0%})", "right / guesses",
                "m", "verdict"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.variant, f"{r.claimed_epsilon:.3g}", r.accountant, f"{r.delta:.2g}", f"{r.epsilon_lb:.3g}",
                      f"{r.correct}/{r.guesses}", str(r.m), "consistent" if r.consistent else "CLAIM VIOLATED")
    console.print(table)
    for r in rows:
        console.print(r.text())
    if cfg.noise_divisor != 1:
        console.print(f"broken on purpose: trained with σ = {rows[0].trained_noise_multiplier:.3g}, claim keeps "
                      f"σ = {rows[0].claimed_noise_multiplier:.3g}")
    console.print(f"test accuracy {rows[0].test_accuracy:.3f}; wrote {out}/results.md, results.csv, results.json, "
                  "canaries/")


@app.command("invert")
def invert_cmd(
    config: Path = typer.Argument(..., help="Inversion TOML (see examples/privacy_invert.toml)."),
    out: Path = typer.Option(..., "--out", help="Output folder for the image grids and tables."),
    set_: list[str] = typer.Option(None, "--set", help=SET_HELP),
) -> None:
    """Model inversion (Eq. 8.1) and overt-encoding grids for standard / PGD / GloRo models."""
    from modelward.core.progress import RichProgress
    from modelward.privacy.inspect_models import InvertConfig, run_invert

    cfg = load_config(config, InvertConfig, set_)
    check_out_dir(out)
    with RichProgress(console) as progress:
        rows = run_invert(cfg, out, progress)
    for r in rows:
        console.print(", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
    console.print(f"wrote {out}/inversions_*.png, columns_*.png, results.md")


@app.command("property")
def property_cmd(
    config: Path = typer.Argument(..., help="Property-inference TOML (see examples/privacy_property.toml)."),
    out: Path = typer.Option(..., "--out", help="Output folder."),
    set_: list[str] = typer.Option(None, "--set", help=SET_HELP),
) -> None:
    """Reconstruction-based watermark property inference (Alg. 8.4): F1 per trainer, reconstruction grids."""
    from modelward.core.progress import RichProgress
    from modelward.privacy.property import PropertyConfig, run_property

    cfg = load_config(config, PropertyConfig, set_)
    check_out_dir(out)
    with RichProgress(console) as progress:
        res = run_property(cfg, out, progress)
    table = Table(title=f"{cfg.name}: property inference ({cfg.properties} watermarks)")
    for col in ("trainer", "F1 (micro)", "top-1", "chance", "train F1", "model acc."):
        table.add_column(col)
    for r in res:
        table.add_row(r.trainer, f"{r.f1_micro:.3f}", f"{r.top1_accuracy:.3f}", f"{r.chance_top1:.3f}",
                      f"{r.train_f1_micro:.3f}", f"{r.mean_model_accuracy:.3f}")
    console.print(table)
    console.print(f"wrote {out}/results.md, watermarks.png, reconstructions_*.png")


@app.command("attacks")
def attacks() -> None:
    """List the membership-inference attacks and their parameters."""
    from modelward.privacy.membership import ATTACKS

    for name in ATTACKS.names():
        console.print(f"{name}: {', '.join(ATTACKS.parameters(name)) or '(no parameters)'}")
