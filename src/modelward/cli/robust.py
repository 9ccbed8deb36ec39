"""``modelward robust``: train (standard / pgd / trades / gloro / rtk / affinity), attack, certify (seed 002 ch. 6–7,
seed 004 ch. 2, 5). Thin: parse the TOML config, call :mod:`modelward.robustness.experiment` (which writes the
reports), print."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from modelward.cli._device import DEVICE_HELP, require_device, with_device
from modelward.cli._outdir import check_out_dir, refuse_other_config
from modelward.core.config import load_config
from modelward.core.data import load_data
from modelward.core.progress import RichProgress
from modelward.errors import ConfigError
from modelward.robustness.experiment import (
    GLORO_MODES,
    RobustConfig,
    attack_experiment,
    certify_experiment,
    check_attacks,
    check_shapes,
    eval_points,
    load_model,
    train_experiment,
)

app = typer.Typer(no_args_is_help=True, help="Evasion attacks, adversarial training and GloRo certification.")
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
            attacks: bool = typer.Option(True, "--attacks/--no-attacks", help="Also report robust accuracy."),
            device: str | None = typer.Option(None, "--device", help=DEVICE_HELP)) -> None:
    """Clean accuracy, VRA and rejection per ε (GloRo certificate), plus robust accuracy under the attacks."""
    cfg, net, x, y, eps = _prepare_evaluation(config, model, out, set_, device=device)
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
           device: str | None = typer.Option(None, "--device", help=DEVICE_HELP)) -> None:
    """Robust accuracy per ε for each configured attack (CSV/MD + robustness curve)."""
    cfg, net, x, y, eps = _prepare_evaluation(config, model, out, set_, need_attacks=True, device=device)
    with RichProgress(console) as progress:
        rows = attack_experiment(cfg, net, x, y, out, progress)
    for r in rows:
        console.print(f"{r['attack']:>8} ε={r['eps']:.3f}  robust accuracy {r['robust_accuracy']:.3f}")
    console.print(f"wrote {out / 'attack.csv'}, attack.md, attack.png")
