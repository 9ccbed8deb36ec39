"""``modelward robust``: train (standard / pgd / trades / gloro / rtk / affinity), attack, certify (seed 002 ch. 6–7,
seed 004 ch. 2, 5). Thin: parse the TOML config, call :mod:`modelward.robustness.experiment` (which writes the
reports), print."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from modelward.cli._device import DEVICE_HELP, require_device, with_device
from modelward.cli._outdir import check_out_dir, refuse_other_config
from modelward.core.config import load_config
from modelward.core.data import load_data
from modelward.core.progress import RichProgress
from modelward.errors import ConfigError
from modelward.robustness.experiment import (
    CERTIFY_METHODS,
    GLORO_MODES,
    RobustConfig,
    attack_experiment,
    autoattack_experiment,
    bound_certify_experiment,
    certify_experiment,
    check_attacks,
    check_shapes,
    eval_points,
    load_model,
    smoothing_certify_experiment,
    train_experiment,
)

app = typer.Typer(no_args_is_help=True, help="Evasion attacks (AutoAttack), adversarial training and certification "
                                             "(GloRo, randomized smoothing, IBP, CROWN).")
console = Console()

SET_HELP = "Override a config value, e.g. --set train.epochs=20 (repeatable)."


def _run_config(cfg: RobustConfig) -> dict:
    """The config a run folder records (config.json): everything but the device (a run may resume elsewhere)."""
    return json.loads(json.dumps(cfg.model_dump(mode="json", exclude={"device"}), sort_keys=True))


def _model_path(model: Path | None, out: Path) -> Path:
    p = model or out
    if p.is_dir():
        p = p / "model.safetensors"
    if not p.is_file():
        raise ConfigError(f"--model {p}: no trained model there (run 'modelward robust train CONFIG --out DIR')")
    return p


def _prepare_evaluation(config: Path, model: Path | None, out: Path, set_: list[str] | None,
                        need_attacks: bool = False, device: str | None = None):  # type: ignore[no-untyped-def]
    """Shared by certify and attack: config, trained net (shape-checked, on the device), evaluation points, ε
    list, --out ready."""
    cfg = load_config(config, RobustConfig, with_device(set_, device))
    require_device(cfg.device)
    if need_attacks and not cfg.evaluate.attacks:
        raise ConfigError(f"{config}: evaluate.attacks is empty; add e.g. [[evaluate.attacks]] name = \"pgd\"")
    check_attacks(cfg.evaluate.attacks, cfg.evaluate.norm)  # before any model is loaded or attack runs
    net, _ = load_model(_model_path(model, out), cfg.device)
    data = load_data(cfg.data)
    check_shapes(net, data)
    x, y = eval_points(cfg, data)
    check_out_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    return cfg, net, x, y, cfg.evaluate.epsilons


@app.command()
def train(config: Path = typer.Argument(..., help="TOML config (see examples/robust_*.toml)."),
          out: Path = typer.Option(..., "--out", help="Run directory (resumes from its checkpoint)."),
          set_: list[str] = typer.Option([], "--set", help=SET_HELP),
          device: str | None = typer.Option(None, "--device", help=DEVICE_HELP)) -> None:
    """Train a model in the configured mode and save it as OUT/model.safetensors (+ metrics, history)."""
    cfg = load_config(config, RobustConfig, with_device(set_, device))
    require_device(cfg.device)
    check_out_dir(out)
    # a different config would silently overwrite the finished model of the other one
    refuse_other_config(out, "config.json", _run_config(cfg), ("model.safetensors", "checkpoint.safetensors"))
    data = load_data(cfg.data)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(_run_config(cfg), indent=2, sort_keys=True) + "\n")
    console.print(f"[bold]robust train[/] mode={cfg.train.mode} arch={cfg.model.arch} · {data.describe()}")
    with RichProgress(console) as progress:
        metrics = train_experiment(cfg, out, progress, data)
    guarantee = "" if cfg.train.mode in GLORO_MODES else " (uncertified training: VRA is expected to be ≈ 0)"
    console.print(f"clean accuracy {metrics['clean_accuracy']:.3f} · VRA@ε={cfg.train.epsilon} "
                  f"{metrics['vra']:.3f}{guarantee} · saved {out / 'model.safetensors'}")


@app.command()
def certify(config: Path = typer.Argument(..., help="TOML config (\\[data] and \\[evaluate] are used)."),
            model: Path | None = typer.Option(None, "--model", help="model.safetensors or its run directory."),
            out: Path = typer.Option(Path("."), "--out", help="Output directory."),
            set_: list[str] = typer.Option([], "--set", help=SET_HELP),
            method: str = typer.Option("gloro", "--method", help=f"Certificate: {' | '.join(CERTIFY_METHODS)}."),
            attacks: bool = typer.Option(True, "--attacks/--no-attacks", help="gloro: also report robust accuracy."),
            sigma: float = typer.Option(0.25, "--sigma", help="smoothing: noise level σ."),
            n0: int = typer.Option(100, "--n0", help="smoothing: samples to pick the class."),
            n: int = typer.Option(10_000, "--n", help="smoothing: samples to bound its probability."),
            alpha: float = typer.Option(0.001, "--alpha", help="smoothing: failure probability per point."),
            device: str | None = typer.Option(None, "--device", help=DEVICE_HELP)) -> None:
    """Certified accuracy per ε: GloRo (VRA, rejection), randomized smoothing, IBP or CROWN."""
    if method not in CERTIFY_METHODS:
        raise ConfigError(f"--method {method!r}: choose one of {', '.join(CERTIFY_METHODS)}")
    cfg, net, x, y, eps = _prepare_evaluation(config, model, out, set_, device=device)
    if method == "smoothing":
        rows = smoothing_certify_experiment(cfg, net, x, y, out, sigma, n0, n, alpha)
        for r in rows:
            console.print(f"ε={r['epsilon']:.3f}  smoothing (σ={sigma}) certified {r['certified_accuracy']:.3f}  "
                          f"abstain {r['abstain_rate']:.3f}")
    elif method in ("ibp", "crown"):
        rows = bound_certify_experiment(cfg, net, x, y, out, method)
        for r in rows:
            console.print(f"ε={r['epsilon']:.3f}  clean {r['clean_accuracy']:.3f}  {method.upper()} certified "
                          f"{r['certified_accuracy']:.3f}")
    else:
        with RichProgress(console) as progress:
            rows = certify_experiment(cfg, net, x, y, out, attacks, progress)
        for r in rows:
            console.print(f"ε={r['epsilon']:.3f}  clean {r['clean_accuracy']:.3f}  VRA {r['vra']:.3f}  "
                          f"rejected {r['rejection_rate']:.3f}")
    console.print(f"wrote {out / 'certify.csv'}, certify.md, certify.png")


@app.command()
def attack(config: Path = typer.Argument(..., help="TOML config (\\[data] and \\[evaluate] are used)."),
           model: Path | None = typer.Option(None, "--model", help="model.safetensors or its run directory."),
           out: Path = typer.Option(Path("."), "--out", help="Output directory."),
           set_: list[str] = typer.Option([], "--set", help=SET_HELP),
           suite: str = typer.Option("config", "--suite",
                                     help="config: the attacks of [evaluate.attacks]; autoattack: AutoAttack "
                                          "(standard) with every applicable certificate (the sandwich)."),
           steps: int = typer.Option(100, "--steps", help="autoattack: APGD / APGD-T / FAB-T iterations."),
           queries: int = typer.Option(5000, "--queries", help="autoattack: Square's query budget."),
           device: str | None = typer.Option(None, "--device", help=DEVICE_HELP)) -> None:
    """Robust accuracy per ε: the configured attacks, or AutoAttack with the certified/attacked sandwich."""
    if suite not in ("config", "autoattack"):
        raise ConfigError(f"--suite {suite!r}: choose 'config' or 'autoattack'")
    cfg, net, x, y, eps = _prepare_evaluation(config, model, out, set_, need_attacks=suite == "config",
                                              device=device)
    if suite == "autoattack":
        with RichProgress(console) as progress:
            data = autoattack_experiment(cfg, net, x, y, out, {"steps": steps, "n_queries": queries}, progress)
        for r in data["rows"]:
            console.print(f"ε={r['eps']:.3f}  certified ≥ {r['certified_lower']:.3f}  AutoAttack ≤ "
                          f"{r['attacked_upper']:.3f}  gap {r['gap']:.3f}  (unresolved {r['unresolved']})")
        for d in data["diagnostics"]:
            tag = "[bold]NOTE[/]" if d.get("info") else "[bold yellow]FLAG[/]"
            console.print(f"{tag} {d['flag']} (ε={d['eps']}): {escape(d['detail'])}")
        console.print(f"wrote {out / 'sandwich.md'}, points.json, attack.csv, attack.png")
        return
    with RichProgress(console) as progress:
        rows = attack_experiment(cfg, net, x, y, out, progress)
    for r in rows:
        console.print(f"{r['attack']:>8} ε={r['eps']:.3f}  robust accuracy {r['robust_accuracy']:.3f}")
    console.print(f"wrote {out / 'attack.csv'}, attack.md, attack.png")
