"""``modelward robust``: train (standard / pgd / trades / gloro / rtk / affinity), attack, certify (seed 002 ch. 6–7,
seed 004 ch. 2, 5). Thin: parse the TOML config, call :mod:`modelward.robustness.gloro.run`, write CSV/MD/PNG."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from modelward.cli._outdir import check_out_dir, refuse_other_config
from modelward.core.config import dump_config, load_config
from modelward.core.data import load_data
from modelward.core.progress import make_progress
from modelward.errors import ConfigError
from modelward.robustness.gloro.run import (
    GLORO_MODES,
    RobustConfig,
    attack_table,
    certify_table,
    check_attacks,
    check_shapes,
    eval_points,
    load_model,
    save_model,
    train_robust,
)

app = typer.Typer(no_args_is_help=True, help="Evasion attacks, adversarial training and GloRo certification.")
console = Console()

SET_HELP = "Override a config value, e.g. --set train.epochs=20 (repeatable)."


def _write_table(out: Path, stem: str, rows: list[dict[str, Any]], title: str) -> None:
    if not rows:
        return
    keys = list(rows[0])
    with open(out / f"{stem}.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, keys)
        w.writeheader()
        w.writerows(rows)
    fmt = [f"{v:.4f}" if isinstance(v, float) else str(v) for r in rows for v in r.values()]
    lines = [f"# {title}", "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for i in range(len(rows)):
        lines.append("| " + " | ".join(fmt[i * len(keys) : (i + 1) * len(keys)]) + " |")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    (out / f"{stem}.json").write_text(json.dumps(rows, indent=2) + "\n")


def _model_path(model: Path | None, out: Path) -> Path:
    p = model or out
    if p.is_dir():
        p = p / "model.safetensors"
    if not p.is_file():
        raise ConfigError(f"--model {p}: no trained model there (run 'modelward robust train CONFIG --out DIR')")
    return p


def _prepare_evaluation(config: Path, model: Path | None, out: Path, set_: list[str] | None,
                        need_attacks: bool = False):  # type: ignore[no-untyped-def]
    """Shared by certify and attack: config, trained net (shape-checked), evaluation points, ε list, --out ready."""
    cfg = load_config(config, RobustConfig, set_)
    if need_attacks and not cfg.evaluate.attacks:
        raise ConfigError(f"{config}: evaluate.attacks is empty; add e.g. [[evaluate.attacks]] name = \"pgd\"")
    check_attacks(cfg.evaluate.attacks, cfg.evaluate.norm)  # before any model is loaded or attack runs
    net, _ = load_model(_model_path(model, out))
    data = load_data(cfg.data)
    check_shapes(net, data)
    x, y = eval_points(cfg, data)
    check_out_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    return cfg, net, x, y, cfg.evaluate.epsilons


@app.command()
def train(config: Path = typer.Argument(..., help="TOML config (see examples/robust_*.toml)."),
          out: Path = typer.Option(..., "--out", help="Run directory (resumes from its checkpoint)."),
          set_: list[str] = typer.Option([], "--set", help=SET_HELP)) -> None:
    """Train a model in the configured mode and save it as OUT/model.safetensors (+ metrics, history)."""
    cfg = load_config(config, RobustConfig, set_)
    check_out_dir(out)
    # a different config would silently overwrite the finished model of the other one
    refuse_other_config(out, "config.json", json.loads(json.dumps(cfg.model_dump(mode="json"), sort_keys=True)),
                        ("model.safetensors", "checkpoint.safetensors"))
    data = load_data(cfg.data)
    out.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, out / "config.json")
    console.print(f"[bold]robust train[/] mode={cfg.train.mode} arch={cfg.model.arch} · {data.describe()}")
    with make_progress(console) as progress:
        task = progress.add_task(f"train ({cfg.train.mode})", total=cfg.train.epochs, info="")

        def on_progress(done: int, total: int, info: str) -> None:
            progress.update(task, completed=done, info=info)

        outcome = train_robust(cfg, data, out, on_progress)
        progress.update(task, completed=cfg.train.epochs)
    save_model(out / "model.safetensors", outcome, cfg, data.input_shape, data.num_classes)
    rows, bound = certify_table(outcome.net, data.x_test, data.y_test, [cfg.train.epsilon])
    metrics = {"mode": cfg.train.mode, "seconds": outcome.seconds, "epsilon": cfg.train.epsilon, **rows[0],
               "lipschitz_sub": bound["lipschitz_sub"], "max_margin_lipschitz": bound["max_margin_lipschitz"]}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    _write_table(out, "history", outcome.history, "training history")
    guarantee = "" if cfg.train.mode in GLORO_MODES else " (uncertified training: VRA is expected to be ≈ 0)"
    console.print(f"clean accuracy {metrics['clean_accuracy']:.3f} · VRA@ε={cfg.train.epsilon} "
                  f"{metrics['vra']:.3f}{guarantee} · saved {out / 'model.safetensors'}")


@app.command()
def certify(config: Path = typer.Argument(..., help="TOML config (\\[data] and \\[evaluate] are used)."),
            model: Path | None = typer.Option(None, "--model", help="model.safetensors or its run directory."),
            out: Path = typer.Option(Path("."), "--out", help="Output directory."),
            set_: list[str] = typer.Option([], "--set", help=SET_HELP),
            attacks: bool = typer.Option(True, "--attacks/--no-attacks", help="Also report robust accuracy.")) -> None:
    """Clean accuracy, VRA and rejection per ε (GloRo certificate), plus robust accuracy under the attacks."""
    cfg, net, x, y, eps = _prepare_evaluation(config, model, out, set_)
    rows, bound = certify_table(net, x, y, eps, cfg.evaluate.batch_size)
    if attacks and cfg.evaluate.attacks:
        with make_progress(console) as progress:
            task = progress.add_task("attacks", total=len(eps) * len(cfg.evaluate.attacks), info="")
            arows = attack_table(net.f, x, y, eps, cfg.evaluate.attacks, cfg.seed,
                                 lambda name, e: progress.update(task, advance=1, info=f"{name} ε={e}"),
                                 norm=cfg.evaluate.norm)
        for r in rows:
            for a in arows:
                if a["eps"] == r["epsilon"]:
                    r[f"robust_accuracy_{a['attack']}"] = a["robust_accuracy"]
    _write_table(out, "certify", rows, f"GloRo certification ({len(y)} test points)")
    (out / "lipschitz.json").write_text(json.dumps(bound, indent=2) + "\n")
    from modelward.core.plots import line_plot

    series = {"VRA (certified)": (eps, [r["vra"] for r in rows]),
              "clean accuracy": (eps, [r["clean_accuracy"] for r in rows])}
    for key in rows[0]:
        if key.startswith("robust_accuracy_"):
            series[key.replace("robust_accuracy_", "robust acc. ")] = (eps, [r[key] for r in rows])
    line_plot(out / "certify.png", series, "Certified (VRA) and empirical robustness",
              f"ε ({cfg.evaluate.norm})", "accuracy")
    for r in rows:
        console.print(f"ε={r['epsilon']:.3f}  clean {r['clean_accuracy']:.3f}  VRA {r['vra']:.3f}  "
                      f"rejected {r['rejection_rate']:.3f}")
    console.print(f"wrote {out / 'certify.csv'}, certify.md, certify.png")


@app.command()
def attack(config: Path = typer.Argument(..., help="TOML config (\\[data] and \\[evaluate] are used)."),
           model: Path | None = typer.Option(None, "--model", help="model.safetensors or its run directory."),
           out: Path = typer.Option(Path("."), "--out", help="Output directory."),
           set_: list[str] = typer.Option([], "--set", help=SET_HELP)) -> None:
    """Robust accuracy per ε for each configured attack (CSV/MD + robustness curve)."""
    cfg, net, x, y, eps = _prepare_evaluation(config, model, out, set_, need_attacks=True)
    with make_progress(console) as progress:
        task = progress.add_task("attacks", total=len(eps) * len(cfg.evaluate.attacks), info="")
        rows = attack_table(net.f, x, y, eps, cfg.evaluate.attacks, cfg.seed,
                            lambda name, e: progress.update(task, advance=1, info=f"{name} ε={e}"),
                            norm=cfg.evaluate.norm)
    _write_table(out, "attack", rows, f"Robust accuracy ({len(y)} test points)")
    from modelward.core.plots import line_plot

    series = {a.name: (eps, [r["robust_accuracy"] for r in rows if r["attack"] == a.name])
              for a in cfg.evaluate.attacks}
    line_plot(out / "attack.png", series, "Robust accuracy vs ε", f"ε ({cfg.evaluate.norm})", "robust accuracy")
    for r in rows:
        console.print(f"{r['attack']:>8} ε={r['eps']:.3f}  robust accuracy {r['robust_accuracy']:.3f}")
    console.print(f"wrote {out / 'attack.csv'}, attack.md, attack.png")
