"""The supervised completion problem (seed 000 §4): a zoo model trained on a data set with procedure T, then one
part reset and retrained. Cost = minibatch steps; L = top-1 error (or cross-entropy).

Which split L is measured on (``threshold_split``): ``"validation"`` (default) holds a fixed ``val_fraction`` of
the training set out of training — the same split for every seed and run — and measures every curve on it (ℓ*,
L(θ₀), C and C'); the original runs also record their test curve (``extras["test_curve"]``), which the report
shows. ``"test"`` measures on the test split, as the paper does (§3: "performance on the test loss").

Seeds are paired (``procedures.paired_seeds``): retraining seed i draws the same batches for every part and
procedure, and every procedure resetting a part starts from the same re-initialised weights. T0 (from scratch)
re-initialises everything and trains with the original schedule (``train``), not the retraining one."""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from modelward.completion.problem import CompletionProblem, Curve, OnEval, OriginalRun, ProcedureSpec
from modelward.completion.procedures import ALL_PARTS, paired_seeds, prepare_retraining, stable_seed
from modelward.core.data import DataConfig, DataSplit, load_data
from modelward.core.datasets import load_lazy_split
from modelward.core.device import resolve_device
from modelward.core.init import init_model_
from modelward.core.io import load_into, load_state_dict, save_state_dict
from modelward.core.parts import default_part_names, parts_table, resolve_part
from modelward.core.seed import seeded
from modelward.core.train import Checkpointing, TrainConfig, evaluate, train
from modelward.core.zoo import ModelConfig, build_model


@lru_cache(maxsize=4)
def _data(cfg_json: str) -> DataSplit:
    cfg = DataConfig.model_validate_json(cfg_json)
    if cfg.lazy:  # ImageNet-sized data: Datasets read on demand (core.datasets), decoded by cfg.workers processes
        return load_lazy_split(cfg)
    return load_data(cfg)


class SupervisedProblem(CompletionProblem):
    """`data` × `model` × training procedure `train`; retraining uses `retrain_lr_schedule` if given."""

    tasks = [""]

    def __init__(self, data: DataConfig, model: ModelConfig, train_cfg: TrainConfig,
                 retrain_lr: float | None = None, retrain_lr_schedule: list[tuple[int, float]] | None = None,
                 init_scheme: str = "glorot_uniform", *, device: str = "cpu",
                 checkpoint_every: int | None = None, threshold_split: str = "validation",
                 val_fraction: float = 0.2) -> None:
        self.device = device
        self.checkpoint_every = checkpoint_every
        self.data_cfg = data
        self.model_cfg = model
        self.train_cfg = train_cfg
        self.retrain_lr = retrain_lr
        self.retrain_lr_schedule = retrain_lr_schedule
        self.init_scheme = init_scheme
        self.threshold_split = threshold_split
        self.val_fraction = val_fraction

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

    def splits(self) -> tuple[Any, Any, Any, Any]:
        """(x_fit, y_fit, x_eval, y_eval): the data T trains on and the split L is measured on."""
        d = self.data
        if self.threshold_split == "test":
            return d.x_train, d.y_train, d.x_test, d.y_test
        n = len(d.x_train)
        k = min(n - 1, max(1, round(self.val_fraction * n)))
        # one fixed split for the whole study: it depends on the data size only, never on a run's seed
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(stable_seed("validation", n)))
        val, fit = perm[:k], perm[k:]
        if isinstance(d.x_train, torch.Tensor):
            return d.x_train[fit], d.y_train[fit], d.x_train[val], d.y_train[val]
        from torch.utils.data import Subset  # lazy data sets (labels inside the Dataset)

        return Subset(d.x_train, fit.tolist()), None, Subset(d.x_train, val.tolist()), None

    def fit_split(self) -> DataSplit:
        """The data as training sees it: ``x_train`` = what T trains on, ``x_test`` = the split L is measured on
        (the validation split by default) — e.g. for training an original elsewhere (split between parties)."""
        from dataclasses import replace

        x_fit, y_fit, x_eval, y_eval = self.splits()
        return replace(self.data, x_train=x_fit, y_train=y_fit, x_test=x_eval, y_test=y_eval)

    def _fit(self, model: torch.nn.Module, cfg: TrainConfig, seed: int, trainable: set[str] | None,
             stop_at: float | None, on_eval: OnEval | None, progress_file: Path | None = None,
             test_curve: Curve | None = None) -> Curve:
        """Train on the problem's device (on ``splits()``: the validation split gives L by default; `test_curve`
        collects the test loss at every evaluation); with ``checkpoint_every`` the run's state goes to
        `progress_file` every k steps and a restarted run resumes from it (bit-identical on the CPU), then the file
        is removed."""
        x_fit, y_fit, x_eval, y_eval = self.splits()
        model.to(resolve_device(self.device))
        hook = on_eval
        if test_curve is not None and self.threshold_split != "test":
            d = self.data

            def hook(step: int, loss: float) -> None:  # the test split reports alongside the validation curve
                test_curve.append((int(step), float(evaluate(model, d.x_test, d.y_test, cfg.loss,
                                                             cfg.eval_batch_size))))
                if on_eval is not None:
                    on_eval(step, loss)

        ck = None
        if self.checkpoint_every is not None and progress_file is not None:
            ck = Checkpointing(progress_file, self.checkpoint_every)
        res = train(model, x_fit, y_fit, x_eval, y_eval, cfg, seed, trainable, stop_at, hook, checkpoint=ck,
                    workers=self.data_cfg.workers)
        model.cpu()
        if ck is not None:
            progress_file.unlink(missing_ok=True)  # type: ignore[union-attr]
        return [(int(s), float(v)) for s, v in res.curve]

    # -- protocol ---------------------------------------------------------------------------------------------
    def train_original(self, seed: int, task: str, workdir: Path, on_eval: OnEval | None = None) -> OriginalRun:
        test_curve: Curve = []
        with seeded(seed):  # the module constructors draw from the global RNG
            model = init_model_(self.build(), self.init_scheme, seed)
            curve = self._fit(model, self.train_cfg, seed, None, None, on_eval,
                              Path(workdir) / f"original_seed{seed}.progress.safetensors", test_curve)
        ckpt = Path(workdir) / f"original_seed{seed}.safetensors"
        save_state_dict(ckpt, model.state_dict(), {"seed": seed})
        extras: dict[str, Any] = {"threshold_split": self.threshold_split}
        if test_curve:
            extras["test_curve"] = [list(p) for p in test_curve]
        return OriginalRun(seed, task, curve, ckpt, extras)

    def retrain(self, original: OriginalRun, part: str, procedure: ProcedureSpec, seed: int, budget: int,
                stop_at: float | None, workdir: Path, on_eval: OnEval | None = None) -> Curve:
        model = self.build()
        state, _ = load_state_dict(original.checkpoint)
        load_into(model, state, original.checkpoint)
        tseed, iseed = paired_seeds(seed, original.task, ALL_PARTS if procedure.from_scratch else part)
        gen = torch.Generator().manual_seed(iseed)
        trainable = prepare_retraining(model, part, procedure, gen)
        update: dict[str, Any] = {"steps": budget}
        # T0 repeats T: the original schedule; T1–T4 use the retraining schedule where one is given
        lr = procedure.lr if procedure.lr is not None else (None if procedure.from_scratch else self.retrain_lr)
        schedule = procedure.lr_schedule if procedure.lr_schedule is not None else (
            None if procedure.from_scratch else self.retrain_lr_schedule)
        if lr is not None:
            update["lr"] = lr
        if schedule is not None:
            update["lr_schedule"] = schedule
        cfg = self.train_cfg.model_copy(update=update)
        # unique per part × procedure (the paired seeds are not)
        progress = Path(workdir) / f"retrain_{seed}_{stable_seed(part, procedure.name)}.progress.safetensors"
        return self._fit(model, cfg, tseed, trainable, stop_at, on_eval, progress)


class ModuleProblem(SupervisedProblem):
    """The supervised completion problem for your own ``nn.Module`` and data (no zoo config, no data file).

    Each seed's original starts from a fresh copy of `model` re-initialised with `init_scheme` and seed (so every
    seed repeats the whole experiment, seed 000 §3.2), trained with `train_cfg`; parts are addressed by module name
    (``modelward.core.parts``). Use with ``run_study(cfg, out, problem=ModuleProblem(...))``; the study config's
    ``data``/``model``/``train`` tables are then not used. For ``workers > 1`` the problem must be picklable.

    Args:
        model: the architecture (its current weights are not used), or a zero-argument factory returning one.
        data: the data set (``modelward.core.data.DataSplit``; the train split trains minus a held-out validation
            split that gives L, the test split reports — see the module docstring; ``threshold_split="test"``
            measures L on the test split).
        train_cfg: procedure T (optimizer, steps, schedule, evaluation every k steps, loss "error"/"ce").
        retrain_lr, retrain_lr_schedule: retraining overrides (the paper's SL retraining is 50% faster).
        init_scheme: the init scheme of the original training and of reset parts.
        device: where runs train and are evaluated ("cpu", "cuda", "auto", ...; docs/devices.md).

    Returns:
        A :class:`~modelward.completion.problem.CompletionProblem` for ``run_study(cfg, out, problem=...)``.

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
                 checkpoint_every: int | None = None, threshold_split: str = "validation",
                 val_fraction: float = 0.2) -> None:
        super().__init__(DataConfig(), ModelConfig(), train_cfg, retrain_lr, retrain_lr_schedule, init_scheme,
                         device=device, checkpoint_every=checkpoint_every, threshold_split=threshold_split,
                         val_fraction=val_fraction)
        self._model = model
        self._split = data

    @property
    def data(self) -> DataSplit:
        return self._split

    def build(self) -> torch.nn.Module:
        if isinstance(self._model, torch.nn.Module):
            return copy.deepcopy(self._model)
        return self._model()
