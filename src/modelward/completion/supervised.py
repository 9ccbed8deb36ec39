"""The supervised completion problem (seed 000 §4): a zoo model trained on a data set with procedure T, then one
part reset and retrained. Cost = minibatch steps; L = test top-1 error (or cross-entropy)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from modelward.completion.problem import CompletionProblem, Curve, OnEval, OriginalRun, ProcedureSpec
from modelward.completion.procedures import prepare_retraining, stable_seed
from modelward.core.data import DataConfig, DataSplit, load_data
from modelward.core.init import init_model_
from modelward.core.io import load_state_dict, save_state_dict
from modelward.core.parts import default_part_names, parts_table, resolve_part
from modelward.core.seed import seeded
from modelward.core.train import Checkpointing, TrainConfig, train
from modelward.core.zoo import ModelConfig, build_model


@lru_cache(maxsize=4)
def _data(cfg_json: str) -> DataSplit:
    return load_data(DataConfig.model_validate_json(cfg_json))


class SupervisedProblem(CompletionProblem):
    """`data` × `model` × training procedure `train`; retraining uses `retrain_lr_schedule` if given."""

    tasks = [""]

    def __init__(self, data: DataConfig, model: ModelConfig, train_cfg: TrainConfig,
                 retrain_lr: float | None = None, retrain_lr_schedule: list[tuple[int, float]] | None = None,
                 init_scheme: str = "glorot_uniform", *, device: str = "cpu",
                 checkpoint_every: int | None = None) -> None:
        self.device = device
        self.checkpoint_every = checkpoint_every
        self.data_cfg = data
        self.model_cfg = model
        self.train_cfg = train_cfg
        self.retrain_lr = retrain_lr
        self.retrain_lr_schedule = retrain_lr_schedule
        self.init_scheme = init_scheme

    # -- helpers ---------------------------------------------------------------------------------------------
    @property
    def data(self) -> DataSplit:
        return _data(self.data_cfg.model_dump_json())

    def build(self) -> torch.nn.Module:
        d = self.data
        return build_model(self.model_cfg, d.input_shape, d.num_classes)

    def part_names(self) -> list[str]:
        return default_part_names(self.build())

    def parts_table(self) -> list[dict[str, Any]]:
        return parts_table(self.build())

    def validate_part(self, part: str) -> None:
        resolve_part(self.build(), part)

    def _fit(self, model: torch.nn.Module, cfg: TrainConfig, seed: int, trainable: set[str] | None,
             stop_at: float | None, on_eval: OnEval | None, progress_file: Path | None = None) -> Curve:
        """Train on the problem's device; with ``checkpoint_every`` the run's state goes to `progress_file` every k
        steps and a restarted run resumes from it (bit-identical on the CPU), then the file is removed."""
        from modelward.core.device import resolve_device

        d = self.data
        model.to(resolve_device(self.device))
        ck = None
        if self.checkpoint_every is not None and progress_file is not None:
            ck = Checkpointing(progress_file, self.checkpoint_every)
        res = train(model, d.x_train, d.y_train, d.x_test, d.y_test, cfg, seed, trainable, stop_at, on_eval,
                    checkpoint=ck)
        model.cpu()
        if ck is not None:
            progress_file.unlink(missing_ok=True)  # type: ignore[union-attr]
        return [(int(s), float(v)) for s, v in res.curve]

    # -- protocol ---------------------------------------------------------------------------------------------
    def train_original(self, seed: int, task: str, workdir: Path, on_eval: OnEval | None = None) -> OriginalRun:
        with seeded(seed):  # the module constructors draw from the global RNG
            model = init_model_(self.build(), self.init_scheme, seed)
            curve = self._fit(model, self.train_cfg, seed, None, None, on_eval,
                              Path(workdir) / f"original_seed{seed}.progress.safetensors")
        ckpt = Path(workdir) / f"original_seed{seed}.safetensors"
        save_state_dict(ckpt, model.state_dict(), {"seed": seed})
        return OriginalRun(seed, task, curve, ckpt)

    def retrain(self, original: OriginalRun, part: str, procedure: ProcedureSpec, seed: int, budget: int,
                stop_at: float | None, workdir: Path, on_eval: OnEval | None = None) -> Curve:
        model = self.build()
        state, _ = load_state_dict(original.checkpoint)
        model.load_state_dict(state)
        rseed = stable_seed("retrain", seed, part, procedure.name)
        gen = torch.Generator().manual_seed(rseed)
        trainable = prepare_retraining(model, part, procedure, gen)
        update: dict[str, Any] = {"steps": budget}
        lr = procedure.lr if procedure.lr is not None else self.retrain_lr
        schedule = procedure.lr_schedule if procedure.lr_schedule is not None else self.retrain_lr_schedule
        if lr is not None:
            update["lr"] = lr
        if schedule is not None:
            update["lr_schedule"] = schedule
        cfg = self.train_cfg.model_copy(update=update)
        progress = Path(workdir) / f"retrain_{seed}_{rseed}.progress.safetensors"  # rseed: unique per part × procedure
        return self._fit(model, cfg, rseed, trainable, stop_at, on_eval, progress)


class ModuleProblem(SupervisedProblem):
    """The supervised completion problem for your own ``nn.Module`` and data (no zoo config, no data file).

    Each seed's original starts from a fresh copy of `model` re-initialised with `init_scheme` and seed (so every
    seed repeats the whole experiment, seed 000 §3.2), trained with `train_cfg`; parts are addressed by module name
    (``modelward.core.parts``). Use with ``run_study(cfg, out, problem=ModuleProblem(...))``; the study config's
    ``data``/``model``/``train`` tables are then not used. For ``workers > 1`` the problem must be picklable.

    Args:
        model: the architecture (its current weights are not used), or a zero-argument factory returning one.
        data: the data set (``modelward.core.data.DataSplit``; train split trains, test split gives L).
        train_cfg: procedure T (optimizer, steps, schedule, evaluation every k steps, loss "error"/"ce").
        retrain_lr, retrain_lr_schedule: retraining overrides (the paper's SL retraining is 50% faster).
        init_scheme: the init scheme of the original training and of reset parts.
        device: where runs train and are evaluated ("cpu", "cuda", "auto", ...; docs/devices.md).

    Example:
        >>> from modelward.core.data import DataConfig, load_data
        >>> from modelward.core.train import TrainConfig
        >>> net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
        >>> problem = ModuleProblem(net, load_data(DataConfig(source="digits")), TrainConfig(steps=20))
        >>> problem.part_names()
        ['1']
    """

    def __init__(self, model: torch.nn.Module | Callable[[], torch.nn.Module], data: DataSplit,
                 train_cfg: TrainConfig, retrain_lr: float | None = None,
                 retrain_lr_schedule: list[tuple[int, float]] | None = None,
                 init_scheme: str = "glorot_uniform", *, device: str = "cpu",
                 checkpoint_every: int | None = None) -> None:
        super().__init__(DataConfig(), ModelConfig(), train_cfg, retrain_lr, retrain_lr_schedule, init_scheme,
                         device=device, checkpoint_every=checkpoint_every)
        self._model = model
        self._split = data

    @property
    def data(self) -> DataSplit:
        return self._split

    def build(self) -> torch.nn.Module:
        if isinstance(self._model, torch.nn.Module):
            return copy.deepcopy(self._model)
        return self._model()
