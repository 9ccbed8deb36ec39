"""`modelward train`: train a zoo model from a config's [data], [model], [train] tables and save it (safetensors)."""

# lazy-imports: commands import the library on call, so `modelward --help` and this group's --help stay fast
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ConfigDict
from rich.console import Console

from modelward.cli._device import DeviceOption, require_device, with_device
from modelward.core.config import StrictModel, load_config
from modelward.core.data import DataConfig
from modelward.core.device import DeviceSetting
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig


class TrainFile(StrictModel):
    """The tables `modelward train` reads; other tables of the file (a study's procedures, ...) are ignored."""

    model_config = ConfigDict(extra="ignore")
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    seed: int = 0
    device: DeviceSetting = "cpu"


def register(app: typer.Typer) -> None:
    @app.command("train")
    def train_cmd(
        config: Annotated[Path, typer.Argument(help="TOML with \\[data], \\[model], \\[train] (a study file works)")],
        out: Annotated[Path, typer.Option("--out", help="checkpoint to write (.safetensors)")],
        seed: Annotated[int | None, typer.Option("--seed", help="initialisation and data-order seed")] = None,
        set_: Annotated[list[str] | None, typer.Option("--set", help="override key=value")] = None,
        device: DeviceOption = None,
        force: Annotated[bool, typer.Option("--force", help="replace an existing checkpoint at --out")] = False,
        checkpoint_every: Annotated[int | None, typer.Option(
            "--checkpoint-every", min=1, help="save the training state every N steps, to resume after Ctrl-C "
            "(default: every evaluation, train.eval_every)")] = None,
    ) -> None:
        """Train a model with procedure T and save its weights, e.g. for `modelward guard serve`.

        An interrupted run (Ctrl-C, a crash) resumes where it stopped when the same command is run again; an
        existing checkpoint at --out is replaced only with --force."""
        from modelward.cli._outdir import check_out_dir
        from modelward.core.io import save_state_dict
        from modelward.core.progress import make_progress
        from modelward.core.train import Checkpointing, evaluate, fit_from_config
        from modelward.errors import ConfigError

        console = Console()
        cfg = load_config(config, TrainFile, with_device(set_, device))
        require_device(cfg.device)
        # checked before training, not when saving after it
        if out.is_dir():
            raise ConfigError(f"--out {out}: is a folder; give the checkpoint file to write, e.g. "
                              f"{out / 'model.safetensors'}")
        check_out_dir(out.parent)
        if out.exists() and not force:
            raise ConfigError(f"--out {out}: a checkpoint is already there; pass --force to replace it, or give "
                              "another --out")
        s = cfg.seed if seed is None else seed
        state = _progress_file(out, cfg, s)
        resumed = _resumed_step(state)
        if resumed is not None:
            console.print(f"resuming from step {resumed} of {cfg.train.steps} ({state})")
        ckpt = Checkpointing(state, checkpoint_every or cfg.train.eval_every)
        with make_progress(console) as progress:
            task = progress.add_task("training", total=cfg.train.steps, info="")

            def on_eval(step: int, loss: float) -> None:
                progress.update(task, completed=step, info=f"test {cfg.train.loss} {loss:.4f}")

            model, result, data = fit_from_config(cfg.data, cfg.model, cfg.train, s, on_eval=on_eval,
                                                  device=cfg.device, checkpoint=ckpt)
        meta = {"kind": "zoo", "model": cfg.model.model_dump(mode="json"), "data": cfg.data.model_dump(mode="json"),
                "input_shape": list(data.input_shape), "num_classes": data.num_classes, "seed": s,
                "final_test_loss": result.curve[-1][1], "loss": cfg.train.loss}
        # the model's own record: `modelward assess` warns, and gives no verdict, far below it
        meta["test_accuracy"] = 1.0 - evaluate(model, data.x_test, data.y_test, "error")
        save_state_dict(out, model.state_dict(), meta)
        state.unlink(missing_ok=True)  # finished: the mid-run state is no longer needed
        console.print(f"{data.describe()}; test {cfg.train.loss} {result.curve[0][1]:.4f} → {result.curve[-1][1]:.4f} "
                      f"after {result.steps_run} steps")
        console.print(f"saved {out} (safetensors; architecture and data config in its metadata)")


def _progress_file(out: Path, cfg: TrainFile, seed: int) -> Path:
    """The mid-run state of this exact run (config and seed; not the device) beside `out`: another config or seed
    never resumes from it."""
    import hashlib
    import json

    key = json.dumps({"cfg": cfg.model_dump(mode="json", exclude={"device"}), "seed": seed}, sort_keys=True)
    return out.with_name(f".{out.name}.{hashlib.sha256(key.encode()).hexdigest()[:12]}.progress.safetensors")


def _resumed_step(state: Path) -> int | None:
    """The step a mid-run state file holds (None when there is none)."""
    import json

    from modelward.core.io import load_metadata

    if not state.is_file():
        return None
    try:
        return int(json.loads(load_metadata(state)["modelward_train"])["step"])
    except (KeyError, ValueError, TypeError):
        return None
