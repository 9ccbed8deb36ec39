"""``modelward backdoor``: plant a backdoor for a self-test, detect one in a model, scan a training set for poisoned
rows, repair a model (issue 41). Thin: parse the TOML config, call :mod:`modelward.backdoor.experiment`, print."""

# lazy-imports: commands import the library on call, so `modelward --help` and this group's --help stay fast
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from modelward.cli._device import DEVICE_HELP, with_device
from modelward.cli._outdir import check_out_dir
from modelward.core.config import load_config

if TYPE_CHECKING:
    from modelward.backdoor.experiment import BackdoorConfig

app = typer.Typer(no_args_is_help=True, help="Backdoors and poisoning: attack (self-test), detect (model), scan "
                                             "(training data), mitigate.")
console = Console()
SET_HELP = "Override a config value, e.g. --set attack.rate=0.1 (repeatable)."
CONFIG_HELP = "Backdoor TOML (see examples/backdoor_digits.toml, examples/backdoor_rgb.toml)."
MODEL_HELP = "The model: a checkpoint (model.safetensors) or the run folder of `backdoor attack` / `modelward train`."


def _config(config: Path, set_: list[str] | None, device: str | None) -> BackdoorConfig:
    from modelward.backdoor.experiment import BackdoorConfig
    from modelward.cli._device import require_device

    cfg = load_config(config, BackdoorConfig, with_device(set_, device))
    require_device(cfg.device)
    return cfg


@app.command("attack")
def attack_cmd(
    config: Path = typer.Argument(..., help=CONFIG_HELP),
    out: Path = typer.Option(..., "--out", help="Run folder: model.safetensors, train_data.npz, poisoned_rows.npy, "
                             "attack.json."),
    set_: list[str] = typer.Option(None, "--set", help=SET_HELP),
    device: str | None = typer.Option(None, "--device", help=DEVICE_HELP),
) -> None:
    """Poison the training set with [attack] and train the model: clean accuracy and attack success rate."""
    from modelward.backdoor.experiment import run_attack
    from modelward.core.progress import RichProgress
    from modelward.errors import ConfigError

    cfg = _config(config, set_, device)
    if cfg.attack is None:
        raise ConfigError(f"{config}: no [attack] table; name the backdoor to plant, e.g. [attack] name = "
                          "\"badnets\" (valid: badnets, blend, wanet, clean_label)")
    check_out_dir(out)
    with RichProgress(console) as progress:
        res = run_attack(cfg, out, progress)
    console.print(f"{res['data']}; {cfg.attack.name} → class {cfg.attack.target}, {res['rows_poisoned']} rows "
                  f"poisoned: clean accuracy {res['clean_accuracy']:.3f}, attack success rate "
                  f"{res['attack_success_rate']:.3f} ({res['asr_hits']}/{res['asr_n']})")
    console.print(f"wrote {out}/model.safetensors, train_data.npz, poisoned_rows.npy, attack.json")


@app.command("detect")
def detect_cmd(
    config: Path = typer.Argument(..., help=CONFIG_HELP),
    model: Path = typer.Option(..., "--model", help=MODEL_HELP),
    out: Path = typer.Option(..., "--out", help="Output folder: detect.json, detect.csv/md, "
                             "reversed_triggers.safetensors."),
    reference: list[Path] = typer.Option(None, "--reference", help="A clean reference model's detect.json (or its "
                                         "folder), repeatable, ≥ 3: calibrate each detector class by class against "
                                         "them (added to the config's detect.reference)."),
    set_: list[str] = typer.Option(None, "--set", help=SET_HELP),
    device: str | None = typer.Option(None, "--device", help=DEVICE_HELP),
) -> None:
    """Model-level detection without the training data: Neural Cleanse, MM-BD and the BatchNorm shift (models with
    BatchNorm layers), a verdict each (and MNTD's meta-classifier with [detect.mntd] enabled: trained on shadow
    models the first time)."""
    from modelward.backdoor.experiment import run_detect
    from modelward.core.progress import RichProgress

    cfg = _config(config, set_, device)
    if reference:
        cfg.detect.reference = [*cfg.detect.reference, *map(str, reference)]
    check_out_dir(out)
    if cfg.detect.mntd.enabled:  # shadow training can take minutes: a progress bar (and its log lines)
        with RichProgress(console) as progress:
            res = run_detect(cfg, model, out, progress)
    else:
        with console.status("reverse-engineering triggers (Neural Cleanse), maximum margins (MM-BD), BatchNorm "
                            "statistics"):
            res = run_detect(cfg, model, out)
    table = Table(title=f"{cfg.name}: model-level backdoor detection")
    for col in ("detector", "statistic", "threshold", "verdict", "suspect class", "p-value"):
        table.add_column(col)
    for v in res["verdicts"]:
        table.add_row(v["detector"], f"{v['statistic']:.2f}", f"{v['threshold']:.2f}",
                      "BACKDOORED" if v["backdoored"] else "no backdoor found",
                      "–" if v["suspect_class"] < 0 else str(v["suspect_class"]),
                      "–" if v["p_value"] is None else f"{v['p_value']:.3g}")
    console.print(table)
    if "decided_by" in res:
        console.print(f"verdict decided by the {res['decided_by']}: "
                      f"{'BACKDOORED' if res['backdoored'] else 'no backdoor found'}")
    for note in res.get("notes", []):
        console.print(note)
    rt = res.get("reversed_trigger")
    if rt:
        console.print(f"Neural Cleanse's smallest trigger (class {rt['class']}, mask L1 {rt['mask_l1']:.1f}) sends "
                      f"{rt['attack_success_rate']:.1%} of held-out inputs of other classes to it")
    console.print(f"wrote {out}/detect.json, detect.md, reversed_triggers.safetensors")


@app.command("scan")
def scan_cmd(
    config: Path = typer.Argument(..., help=CONFIG_HELP),
    model: Path = typer.Option(..., "--model", help=MODEL_HELP),
    out: Path = typer.Option(..., "--out", help="Output folder: scan.csv (every row's scores), scan.json."),
    data: Path | None = typer.Option(None, "--data", help="The training set as .npz (arrays x, y), e.g. the "
                                     "train_data.npz of `backdoor attack` (default: [data]'s training split)."),
    truth: Path | None = typer.Option(None, "--truth", help="Self-test: a .npy bool mask of the poisoned rows "
                                      "(poisoned_rows.npy); adds each method's ROC AUC."),
    top: int = typer.Option(10, "--top", min=0, help="Print the most suspicious rows of each method."),
    set_: list[str] = typer.Option(None, "--set", help=SET_HELP),
    device: str | None = typer.Option(None, "--device", help=DEVICE_HELP),
) -> None:
    """Data-level detection: activation clustering, spectral signatures, SPECTRE; the suspected rows."""
    from modelward.backdoor.experiment import run_scan

    cfg = _config(config, set_, device)
    check_out_dir(out)
    with console.status("scanning the training set"):
        res = run_scan(cfg, model, out, data, truth)
    table = Table(title=f"{cfg.name}: data-level scan of {res['rows']} rows")
    cols = ["method", "suspected rows"] + (["poisoned found", "ROC AUC"] if truth is not None else [])
    for col in cols:
        table.add_column(col)
    for m in res["methods"]:
        extra = [f"{m['true_positives']}/{m['poisoned_rows']}", f"{m['auc']:.3f}"] if truth is not None else []
        table.add_row(m["method"], str(m["suspected"]), *extra)
    console.print(table)
    for m in res["methods"] if top else []:
        console.print(f"{m['method']}: most suspicious rows {m['top'][:top]}")
    console.print(f"wrote {out}/scan.csv, scan.json")


@app.command("mitigate")
def mitigate_cmd(
    config: Path = typer.Argument(..., help=CONFIG_HELP),
    model: Path = typer.Option(..., "--model", help=MODEL_HELP),
    out: Path = typer.Option(..., "--out", help="Output folder: the repaired model.safetensors, mitigate.json."),
    set_: list[str] = typer.Option(None, "--set", help=SET_HELP),
    device: str | None = typer.Option(None, "--device", help=DEVICE_HELP),
) -> None:
    """Repair the model ([mitigate] method: unlearning of the reversed trigger, or fine-pruning)."""
    from modelward.backdoor.experiment import run_mitigate

    cfg = _config(config, set_, device)
    check_out_dir(out)
    with console.status(f"{cfg.mitigate.method}"):
        rep = run_mitigate(cfg, model, out)
    b, a = rep.before, rep.after
    console.print(f"{rep.method}: clean accuracy {b['clean_accuracy']:.3f} → {a['clean_accuracy']:.3f}, attack "
                  f"success rate {b['attack_success_rate']:.3f} → {a['attack_success_rate']:.3f} (measured with "
                  f"{rep.details['asr_measured_with']})")
    console.print(f"wrote {out}/model.safetensors, mitigate.json")
