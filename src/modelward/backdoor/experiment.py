"""The ``modelward backdoor`` jobs: one TOML file (:class:`BackdoorConfig`) names the data, the architecture, the
training recipe, an optional attack (for self-tests) and the options of every detector and of the mitigation.

- :func:`run_attack` — poison the training set, train the model, measure clean accuracy and the attack success
  rate (ASR); writes ``model.safetensors`` (a ``modelward train`` checkpoint: ``assess`` and ``guard serve`` read
  it), ``train_data.npz`` (what the model was trained on), ``poisoned_rows.npy`` (the ground truth) and
  ``attack.json``.
- :func:`run_detect` — model-level detection without the training data (Neural Cleanse, MM-BD); ``detect.json``.
- :func:`run_scan` — data-level detection on a training set (activation clustering, spectral signatures,
  SPECTRE); ``scan.csv`` (every row's scores and whether it is suspected) and ``scan.json``.
- :func:`run_mitigate` — unlearning the reversed trigger or fine-pruning; the repaired ``model.safetensors`` and
  ``mitigate.json`` with clean accuracy and ASR before and after.

**The defender's clean data.** The data's test split is cut in two halves by a seeded permutation
(:func:`defender_split`): the first is the small clean set a defender holds (Neural Cleanse's images, STRIP's
reference, the mitigation's fine-tuning data), the second measures clean accuracy and ASR. The training split is
what the model was trained on (poisoned by ``[attack]``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, field_validator
from torch import nn

from modelward.backdoor.attacks import ATTACKS, make_backdoor_attack
from modelward.backdoor.attacks.base import BackdoorAttack, BackdoorEffect, PoisonedSet, backdoor_effect
from modelward.backdoor.detect.data.activation_clustering import ActivationClustering
from modelward.backdoor.detect.data.base import DataScan, roc_auc
from modelward.backdoor.detect.data.spectral import SpectralSignature
from modelward.backdoor.detect.data.spectre import Spectre
from modelward.backdoor.detect.model.base import ModelVerdict
from modelward.backdoor.detect.model.bn_shift import BatchNormShift
from modelward.backdoor.detect.model.mmbd import MMBD
from modelward.backdoor.detect.model.mntd import MNTD
from modelward.backdoor.detect.model.neural_cleanse import NeuralCleanse, ReversedTriggers
from modelward.backdoor.detect.model.reference import ORIENTATION, reference_from_detect_json
from modelward.backdoor.detect.model.shadows import describe, train_shadows
from modelward.backdoor.features import Layer, representation
from modelward.backdoor.mitigate.base import Mitigation
from modelward.backdoor.mitigate.fine_pruning import effect_of, fine_prune
from modelward.backdoor.mitigate.unlearning import unlearn
from modelward.core.checkpoint import load_checkpoint
from modelward.core.config import StrictModel
from modelward.core.data import DataConfig, DataSplit, load_data
from modelward.core.device import DeviceSetting, resolve_device
from modelward.core.init import init_model_
from modelward.core.io import save_state_dict, save_tensors
from modelward.core.modules import batched_logits
from modelward.core.progress import ProgressSink, as_sink
from modelward.core.records import atomic_write_json, write_csv, write_table
from modelward.core.seed import seeded
from modelward.core.train import TrainConfig, train
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError, DataError

ScanMethod = Literal["activation_clustering", "spectral_signature", "spectre"]
SCAN_METHODS: tuple[ScanMethod, ...] = ("activation_clustering", "spectral_signature", "spectre")


class AttackSpec(StrictModel):
    """``[attack]``: the backdoor planted for a self-test (``modelward backdoor attack``).

    Args:
        name: ``badnets``, ``blend``, ``wanet`` or ``clean_label``.
        target: the target class; rate: the poisoned share of the training set.
        params: the attack's own parameters (trigger size, blend alpha, warp strength, PGD eps, ...).
        surrogate_steps: clean_label: training steps of the surrogate the rows are perturbed against (0: none).
    """

    name: Literal["badnets", "blend", "wanet", "clean_label"] = "badnets"
    target: int = Field(0, ge=0)
    rate: float = Field(0.05, gt=0.0, lt=1.0)
    params: dict[str, Any] = Field(default_factory=dict)
    surrogate_steps: int = Field(300, ge=0)

    @field_validator("params")
    @classmethod
    def _no_reserved(cls, v: dict[str, Any]) -> dict[str, Any]:
        bad = sorted({"target", "rate", "seed", "surrogate"} & set(v))
        if bad:
            raise ValueError(f"{bad} are set by attack.target / attack.rate / seed, not attack.params")
        return v


class NeuralCleanseOptions(StrictModel):
    """``[detect.neural_cleanse]`` (:class:`~modelward.backdoor.detect.model.neural_cleanse.NeuralCleanse`)."""

    enabled: bool = True
    epochs: int = Field(40, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(0.1, gt=0.0)
    init_cost: float = Field(1e-3, gt=0.0)
    threshold: float = Field(2.0, gt=0.0)


class MMBDOptions(StrictModel):
    """``[detect.mmbd]`` (:class:`~modelward.backdoor.detect.model.mmbd.MMBD`)."""

    enabled: bool = True
    starts: int = Field(30, ge=1)
    steps: int = Field(300, ge=1)
    optimizer: Literal["sgd", "adam"] = "adam"
    lr: float = Field(0.05, gt=0.0)
    alpha: float = Field(0.05, gt=0.0, lt=1.0)


class BNShiftOptions(StrictModel):
    """``[detect.bn_shift]`` (:class:`~modelward.backdoor.detect.model.bn_shift.BatchNormShift`): the model's
    BatchNorm running statistics against the defender's clean data, with a null simulated from those data (no
    reference models). ``batch_size``: the training batch size the null assumes; ``draws``: simulated clean runs;
    ``rho``: the poisoned share assumed when naming the suspect class. Skipped (with a note) for a model without
    BatchNorm layers."""

    enabled: bool = True
    draws: int = Field(500, ge=19)
    batch_size: int = Field(64, ge=2)
    alpha: float = Field(0.05, gt=0.0, lt=1.0)
    rho: float = Field(0.05, gt=0.0, le=1.0)


class MNTDOptions(StrictModel):
    """``[detect.mntd]`` (:class:`~modelward.backdoor.detect.model.mntd.MNTD`, off by default: it trains shadow
    models). ``meta``: the meta-classifier file (safetensors + JSON header); when it does not exist yet, ``detect``
    trains it — ``clean_shadows`` + ``jumbo_shadows`` + ``calibration_shadows`` models with this config's
    ``[model]`` and ``[train]`` on ``[data]``'s training split (the defender's own clean data), through the ledger in
    ``shadows`` (resumable) — and writes it there. ``alpha``: the conformal p-value below which MNTD flags."""

    enabled: bool = False
    meta: str = "mntd.safetensors"
    shadows: str = "mntd_shadows"
    clean_shadows: int = Field(32, ge=2)
    jumbo_shadows: int = Field(48, ge=2)
    calibration_shadows: int = Field(20, ge=1)
    clean_label_share: float = Field(0.5, ge=0.0, le=1.0)
    queries: int = Field(10, ge=1)
    epochs: int = Field(100, ge=1)
    alpha: float = Field(0.05, gt=0.0, lt=1.0)
    seed: int = 70_000


class DetectOptions(StrictModel):
    """``[detect]``: model-level detection; ``clean_points`` of the defender's clean half are Neural Cleanse's
    images."""

    clean_points: int = Field(200, ge=10)
    neural_cleanse: NeuralCleanseOptions = Field(default_factory=NeuralCleanseOptions)
    mmbd: MMBDOptions = Field(default_factory=MMBDOptions)
    bn_shift: BNShiftOptions = Field(default_factory=BNShiftOptions)
    mntd: MNTDOptions = Field(default_factory=MNTDOptions)
    #: clean reference models' ``detect.json`` (files or the folders holding them; ≥ 3): each detector's per-class
    #: statistic is then also tested against the same class in them (``detect.model.reference``), and that
    #: calibrated verdict decides ``backdoored``
    reference: list[str] = Field(default_factory=list)
    reference_alpha: float = Field(0.05, gt=0.0, lt=1.0)


class ScanOptions(StrictModel):
    """``[scan]``: data-level detection; ``epsilon`` is the expected poisoned share of a class (spectral methods);
    ``layer`` the representation the detectors read: ``"last_conv"`` (the last convolutional block's output,
    flattened) or ``"penultimate"`` (the input of the last linear layer)."""

    layer: Layer = "last_conv"
    methods: list[ScanMethod] = Field(default_factory=lambda: list(SCAN_METHODS), min_length=1)
    epsilon: float = Field(0.1, gt=0.0, lt=1.0)
    dims: int = Field(10, ge=1)
    size_threshold: float = Field(0.35, gt=0.0, lt=0.5)


class MitigateOptions(StrictModel):
    """``[mitigate]``: ``unlearning`` (the Neural Cleanse trigger of the suspect class, 20 % of the clean rows) or
    ``fine_pruning``; ``steps``/``lr`` of the fine-tuning; ``max_drop``: fine-pruning's accuracy budget."""

    method: Literal["unlearning", "fine_pruning"] = "unlearning"
    steps: int = Field(200, ge=1)
    lr: float = Field(0.01, gt=0.0)
    fraction: float = Field(0.2, gt=0.0, lt=1.0)
    max_drop: float = Field(0.05, ge=0.0, lt=1.0)


class BackdoorConfig(StrictModel):
    """A ``modelward backdoor`` file (see examples/backdoor_digits.toml).

    Example:
        >>> cfg = BackdoorConfig(attack=AttackSpec(name="blend", rate=0.05))
        >>> cfg.data.source, cfg.attack.name
        ('digits', 'blend')
    """

    name: str = "backdoor"
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    attack: AttackSpec | None = None
    detect: DetectOptions = Field(default_factory=DetectOptions)
    scan: ScanOptions = Field(default_factory=ScanOptions)
    mitigate: MitigateOptions = Field(default_factory=MitigateOptions)
    seed: int = 0
    device: DeviceSetting = "cpu"


# ------------------------------------------------------------------------------------------------ building blocks
def defender_split(data: DataSplit, seed: int) -> tuple[tuple[torch.Tensor, torch.Tensor],
                                                        tuple[torch.Tensor, torch.Tensor]]:
    """The defender's clean half and the evaluation half of the test split (seeded permutation).

    Example:
        >>> d = load_data(DataConfig())
        >>> (xd, yd), (xe, ye) = defender_split(d, 0)
        >>> len(xd) + len(xe) == len(d.x_test)
        True
    """
    perm = torch.randperm(len(data.x_test), generator=torch.Generator().manual_seed(seed))
    half = len(perm) // 2
    a, b = perm[:half], perm[half:]
    return (data.x_test[a], data.y_test[a]), (data.x_test[b], data.y_test[b])


def box_of(data: DataSplit) -> tuple[float, float]:
    """The input box triggers and detectors keep to: [0, 1] for images in it, else the data's own range."""
    lo, hi = float(data.x_train.min()), float(data.x_train.max())
    return (0.0, 1.0) if lo >= 0.0 and hi <= 1.0 else (lo, hi)


def train_model(data_cfg_model: ModelConfig, input_shape: tuple[int, ...], num_classes: int, x: torch.Tensor,
                y: torch.Tensor, x_test: torch.Tensor, y_test: torch.Tensor, train_cfg: TrainConfig, seed: int,
                device: str | torch.device = "cpu") -> nn.Module:
    """A zoo model, initialised (Glorot, ``seed``) and trained on ``(x, y)``; eval mode."""
    with seeded(seed):
        model = init_model_(build_model(data_cfg_model, input_shape, num_classes), "glorot_uniform", seed)
        model.to(resolve_device(device))
        train(model, x, y, x_test, y_test, train_cfg, seed)
    return model.eval()


def build_attack(spec: AttackSpec, data: DataSplit, model_cfg: ModelConfig, train_cfg: TrainConfig, seed: int,
                 device: str | torch.device = "cpu") -> BackdoorAttack:
    """The attack of ``spec`` (a clean-label attack gets a surrogate trained on the clean data first)."""
    if spec.target >= data.num_classes:
        raise ConfigError(f"attack.target: {spec.target} is not a class of {data.name} (0..{data.num_classes - 1})")
    params = dict(spec.params)
    params.setdefault("clip", box_of(data))
    attack = make_backdoor_attack(spec.name, target=spec.target, rate=spec.rate, seed=seed, **params)
    if spec.name == "clean_label" and spec.surrogate_steps > 0:
        sur_cfg = train_cfg.model_copy(update={"steps": spec.surrogate_steps, "eval_every": spec.surrogate_steps})
        attack.surrogate = train_model(model_cfg, data.input_shape, data.num_classes, data.x_train, data.y_train,
                                       data.x_test, data.y_test, sur_cfg, seed + 10_000, device).cpu()
    return attack


@dataclass
class Trained:
    """A trained (possibly backdoored) model and how it was made."""

    model: nn.Module
    data: DataSplit
    attack: BackdoorAttack | None
    poisoned: PoisonedSet | None
    effect: BackdoorEffect | None
    seconds: float

    @property
    def x_train(self) -> torch.Tensor:
        return self.poisoned.x if self.poisoned is not None else self.data.x_train

    @property
    def y_train(self) -> torch.Tensor:
        return self.poisoned.y if self.poisoned is not None else self.data.y_train


def train_backdoored(cfg: BackdoorConfig, data: DataSplit | None = None) -> Trained:
    """Poison the training split with ``cfg.attack`` (none: a clean model), train, and measure the effect on the
    evaluation half of the test split."""
    t0 = time.perf_counter()
    data = data or load_data(cfg.data)
    if not data.is_image:
        raise ConfigError(f"backdoor: the data must be images (N×C×H×W); {data.name} has input shape "
                          f"{data.input_shape}")
    attack = poisoned = effect = None
    x, y = data.x_train, data.y_train
    if cfg.attack is not None:
        attack = build_attack(cfg.attack, data, cfg.model, cfg.train, cfg.seed, cfg.device)
        poisoned = attack.poison(x, y)
        x, y = poisoned.x, poisoned.y
    model = train_model(cfg.model, data.input_shape, data.num_classes, x, y, data.x_test, data.y_test, cfg.train,
                        cfg.seed, cfg.device)
    if attack is not None:
        _, (xe, ye) = defender_split(data, cfg.seed)
        effect = backdoor_effect(model, attack.apply, xe, ye, attack.target)
    return Trained(model, data, attack, poisoned, effect, time.perf_counter() - t0)


def model_detectors(opts: DetectOptions, clip: tuple[float, float], seed: int) -> tuple[NeuralCleanse | None,
                                                                                        MMBD | None]:
    nc, mm = opts.neural_cleanse, opts.mmbd
    return (NeuralCleanse(epochs=nc.epochs, batch_size=nc.batch_size, lr=nc.lr, init_cost=nc.init_cost,
                          threshold=nc.threshold, seed=seed, clip=clip) if nc.enabled else None,
            MMBD(starts=mm.starts, steps=mm.steps, lr=mm.lr, optimizer=mm.optimizer, alpha=mm.alpha, seed=seed,
                 clip=clip) if mm.enabled else None)


def bn_shift_detector(opts: DetectOptions, model: nn.Module, seed: int) -> BatchNormShift | None:
    """``[detect.bn_shift]``'s detector, or None when disabled or the model keeps no BatchNorm statistics."""
    b = opts.bn_shift
    if not b.enabled or not BatchNormShift.layers(model):
        return None
    return BatchNormShift(draws=b.draws, batch_size=b.batch_size, alpha=b.alpha, rho=b.rho, seed=seed)


def detect_model(model: nn.Module, data: DataSplit, opts: DetectOptions, seed: int
                 ) -> tuple[list[ModelVerdict], ReversedTriggers | None]:
    """Neural Cleanse, MM-BD and the BatchNorm shift on ``model`` (NC's and the BN shift's images: the first
    ``clean_points`` of the defender's half); the BN shift only where the model has BatchNorm layers."""
    clip = box_of(data)
    nc, mm = model_detectors(opts, clip, seed)
    bn = bn_shift_detector(opts, model, seed)
    (xd, _), _ = defender_split(data, seed)
    verdicts: list[ModelVerdict] = []
    rev = None
    if nc is not None:
        verdicts.append(nc.detect(model, xd[: opts.clean_points], data.num_classes))
        rev = nc.last
    if mm is not None:
        verdicts.append(mm.detect(model, data.input_shape, data.num_classes))
    if bn is not None:
        verdicts.append(bn.detect(model, xd[: opts.clean_points], data.num_classes))
    if not verdicts:
        raise ConfigError("detect: every model-level detector is disabled (detect.neural_cleanse.enabled, "
                          "detect.mmbd.enabled, detect.bn_shift.enabled — the last applies only to models with "
                          "BatchNorm layers)")
    return verdicts, rev


def scan_data(model: nn.Module, x: torch.Tensor, y: torch.Tensor, opts: ScanOptions, seed: int) -> list[DataScan]:
    """Every ``opts.methods`` data-level detector on the training set ``(x, y)`` (the representation at
    ``opts.layer`` computed once)."""
    feats = representation(model, x, opts.layer).numpy()
    made = {"activation_clustering": lambda: ActivationClustering(dims=opts.dims, size_threshold=opts.size_threshold,
                                                                   seed=seed),
            "spectral_signature": lambda: SpectralSignature(epsilon=opts.epsilon),
            "spectre": lambda: Spectre(epsilon=opts.epsilon, seed=seed)}
    return [made[m]().scan(None, x, y, features=feats) for m in opts.methods]


# --------------------------------------------------------------------------------------------------- the four jobs
def _model_meta(cfg: BackdoorConfig, data: DataSplit, extra: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "zoo", "model": cfg.model.model_dump(mode="json"), "data": cfg.data.model_dump(mode="json"),
            "input_shape": list(data.input_shape), "num_classes": data.num_classes, "seed": cfg.seed,
            "loss": cfg.train.loss, **extra}


def run_attack(cfg: BackdoorConfig, out: str | Path, progress: ProgressSink | None = None) -> dict[str, Any]:
    """Plant ``cfg.attack`` (or train a clean model without one) and write the model and its poisoned data.

    Returns:
        ``attack.json``'s content: the attack, clean accuracy and ASR with their counts, rows poisoned.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sink = as_sink(progress)
    sink.start("backdoor-attack", None, f"{cfg.name}: poisoning and training")
    t = train_backdoored(cfg)
    d = t.data
    _, (xe, ye) = defender_split(d, cfg.seed)
    acc = float((batched_logits(t.model, xe).argmax(1) == ye).float().mean())
    res: dict[str, Any] = {"name": cfg.name, "data": d.describe(), "clean_accuracy": acc, "seconds": t.seconds}
    if t.attack is not None and t.poisoned is not None and t.effect is not None:
        res.update({"attack": t.attack.describe(), "rows_poisoned": t.poisoned.n_poisoned,
                    "rows_cover": int(t.poisoned.cover.sum()), **t.effect.to_dict()})
        np.save(out / "poisoned_rows.npy", t.poisoned.poisoned.numpy())
    np.savez(out / "train_data.npz", x=t.x_train.numpy(), y=t.y_train.numpy())
    meta = _model_meta(cfg, d, {"test_accuracy": acc, "backdoor": res.get("attack")})
    save_state_dict(out / "model.safetensors", {k: v.cpu() for k, v in t.model.state_dict().items()}, meta)
    atomic_write_json(out / "attack.json", res)
    sink.done("backdoor-attack")
    return res


def load_model(path: str | Path, cfg: BackdoorConfig) -> nn.Module:
    """A ``modelward train`` / ``backdoor attack`` checkpoint (a file or run folder), on ``cfg.device``."""
    return load_checkpoint(path, resolve_device(cfg.device), kinds=("zoo",)).model


def _verdict_rows(verdicts: list[ModelVerdict]) -> list[dict[str, Any]]:
    return [{"detector": v.detector, "statistic": v.statistic, "threshold": v.threshold,
             "backdoored": v.backdoored, "suspect_class": v.suspect_class, "p_value": v.p_value,
             "seconds": v.seconds} for v in verdicts]


def mntd_detector(cfg: BackdoorConfig, data: DataSplit, progress: ProgressSink | None = None) -> MNTD:
    """``[detect.mntd]``'s meta-classifier: read from ``meta`` when it exists (refused if made for other inputs or
    classes), else trained on shadows (``backdoor.detect.model.shadows``, resumable in ``shadows``) and written
    there."""
    o = cfg.detect.mntd
    meta = Path(o.meta)
    if meta.is_file():
        det = MNTD.load(meta, alpha=o.alpha)
        shape, k = det.input_shape, det.num_classes
        if tuple(shape) != tuple(data.input_shape) or k != data.num_classes:
            raise ConfigError(f"detect.mntd.meta: {meta} was trained for inputs {tuple(shape)} and {k} classes; "
                              f"{data.name} has {tuple(data.input_shape)} and {data.num_classes}: delete it (or name "
                              "another file) to train one for this data")
        return det
    clip = box_of(data)
    ss = train_shadows(o.shadows, data, cfg.model, cfg.train, clip, o.clean_shadows, o.jumbo_shadows,
                       o.calibration_shadows, o.seed, o.clean_label_share, progress=progress)
    det = MNTD(queries=o.queries, epochs=o.epochs, alpha=o.alpha, seed=o.seed)
    det.fit(ss.models, ss.labels, ss.calibration, data.input_shape, data.num_classes, clip, progress=progress)
    meta.parent.mkdir(parents=True, exist_ok=True)
    det.save(meta, {"data": data.name, "shadows": describe(ss.records)})
    return det


def run_detect(cfg: BackdoorConfig, model_path: str | Path, out: str | Path,
               progress: ProgressSink | None = None) -> dict[str, Any]:
    """Model-level detection of the checkpoint ``model_path``; writes ``detect.json`` and ``detect.{csv,md}``.

    Returns:
        ``{"verdicts": [...], "backdoored": any detector flags it, "reversed_trigger": ...}``; with an
        ``[attack]`` in the config (a self-test) also whether the suspect class is the attack's target. With
        ``[detect.mntd] enabled`` MNTD's verdict is added and ``backdoored`` is the union (the others' decision OR
        MNTD's).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = load_model(model_path, cfg)
    data = load_data(cfg.data)
    mntd = mntd_detector(cfg, data, progress) if cfg.detect.mntd.enabled else None  # refused early if it mismatches
    bn_runs = bn_shift_detector(cfg.detect, model, cfg.seed) is not None
    only_mntd = mntd is not None and not (cfg.detect.neural_cleanse.enabled or cfg.detect.mmbd.enabled or bn_runs)
    verdicts, rev = ([], None) if only_mntd else detect_model(model, data, cfg.detect, cfg.seed)
    (xd, _), _ = defender_split(data, cfg.seed)
    settings = detector_settings(*model_detectors(cfg.detect, box_of(data), cfg.seed),
                                 min(cfg.detect.clean_points, len(xd)))
    res: dict[str, Any] = {"model": str(model_path), "verdicts": [v.to_dict() for v in verdicts],
                           "backdoored": any(v.backdoored for v in verdicts), "settings": settings}
    if cfg.detect.bn_shift.enabled and not bn_runs:
        res["notes"] = ["detect.bn_shift: the model has no BatchNorm layer with running statistics; not run"]
    if cfg.detect.reference:
        refs = read_references(cfg.detect.reference)
        check_reference_settings(refs, settings, cfg.detect.reference)
        calibrated = calibrate_verdicts(verdicts, refs, cfg.detect.reference_alpha)
        own = [v for v in verdicts if v.detector == BatchNormShift.name]  # its null needs no references
        verdicts = verdicts + calibrated
        res["verdicts"] += [v.to_dict() for v in calibrated]
        res["backdoored"] = any(v.backdoored for v in calibrated + own)
        res["decided_by"] = ("clean references (" + ", ".join(v.detector for v in calibrated) + ")"
                             + (" or the BatchNorm shift" if own else ""))
    if mntd is not None:
        v_mntd = mntd.detect(model)
        res["verdicts"].append(v_mntd.to_dict())
        verdicts = verdicts + [v_mntd]
        res["backdoored"] = bool(res["backdoored"] or v_mntd.backdoored)
        res["decided_by"] = res.get("decided_by", "the papers' thresholds") + " or MNTD"
        res["mntd"] = {"meta": str(cfg.detect.mntd.meta), **mntd.info}
    if rev is not None:
        nc = verdicts[0]
        _, (xe, ye) = defender_split(data, cfg.seed)
        eff = backdoor_effect(model, rev.trigger(nc.suspect_class, box_of(data)).apply, xe, ye, nc.suspect_class)
        res["reversed_trigger"] = {"class": nc.suspect_class, "mask_l1": float(rev.l1[nc.suspect_class]),
                                   "asr_hits": eff.asr_hits, "asr_n": eff.asr_n,
                                   "attack_success_rate": eff.attack_success_rate}
        save_tensors(out / "reversed_triggers.safetensors", {"masks": rev.masks, "patterns": rev.patterns,
                                                             "l1": rev.l1})
    if cfg.attack is not None:
        res["self_test"] = {"target": cfg.attack.target,
                            "suspects_match": {v.detector: v.suspect_class == cfg.attack.target for v in verdicts}}
    write_table(out, "detect", _verdict_rows(verdicts), title=f"{cfg.name}: model-level backdoor detection")
    atomic_write_json(out / "detect.json", res)
    return res


def detector_settings(nc: NeuralCleanse | None, mm: MMBD | None, clean_points: int) -> dict[str, Any]:
    """The settings a per-class statistic depends on, written next to the verdicts: a clean reference is only
    comparable when they are the same (checked where both ``detect.json`` carry them)."""
    out: dict[str, Any] = {}
    if nc is not None:
        out["neural_cleanse"] = {"clean_points": clean_points, "epochs": nc.epochs, "batch_size": nc.batch_size,
                                 "lr": nc.lr, "init_cost": nc.init_cost}
    if mm is not None:
        out["mmbd"] = {"starts": mm.starts, "steps": mm.steps, "optimizer": mm.optimizer, "lr": mm.lr}
    return out


def check_reference_settings(references: list[dict[str, Any]], settings: dict[str, Any], paths: list[str],
                             key: str = "detect.reference") -> None:
    """Refuse a reference whose recorded detector settings differ from ``settings`` (per detector present in
    both); references without recorded settings (older ``detect.json``) cannot be checked and pass."""
    for ref, path in zip(references, paths, strict=True):
        theirs = ref.get("settings")
        if not isinstance(theirs, dict):
            continue
        for det, mine in settings.items():
            if det in theirs and theirs[det] != mine:
                raise ConfigError(f"{key}: {path} was made with {det} settings {theirs[det]}, this run uses {mine}; "
                                  "a reference is comparable only with the same detector settings (same config / "
                                  "profile)")


def read_references(paths: list[str], key: str = "detect.reference") -> list[dict[str, Any]]:
    """The ``detect.json`` of each clean reference model (a file, or a folder holding one); JSON, no pickle.
    ``key``: the config field the paths came from, named in errors."""
    out = []
    for p in map(Path, paths):
        f = p / "detect.json" if p.is_dir() else p
        try:
            res = json.loads(f.read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"{key}: {f} is not a readable detect.json ({e})") from None
        if not isinstance(res, dict) or not isinstance(res.get("verdicts"), list):
            raise ConfigError(f"{key}: {f} has no 'verdicts' list (write it with `modelward backdoor "
                              "detect` on a clean reference model)")
        out.append(res)
    return out


def calibrate_verdicts(verdicts: list[ModelVerdict], references: list[dict[str, Any]], alpha: float
                       ) -> list[ModelVerdict]:
    """Each verdict tested against the same detector's per-class statistics on the clean ``references``
    (:class:`~modelward.backdoor.detect.model.reference.CleanReference`)."""
    return [reference_from_detect_json(references, v.detector, alpha).test(v) for v in verdicts
            if v.detector in ORIENTATION]


def read_training_set(path: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
    """An ``.npz`` with arrays ``x`` and ``y`` (read without pickle)."""
    p = Path(path)
    try:
        with np.load(p, allow_pickle=False) as f:
            if "x" not in f or "y" not in f:
                raise DataError(f"{p}: needs arrays 'x' and 'y' (found {sorted(f.files)})")
            return torch.as_tensor(np.asarray(f["x"], np.float32)), torch.as_tensor(np.asarray(f["y"], np.int64))
    except (OSError, ValueError) as e:
        raise DataError(f"{p}: not a readable .npz ({e})") from None


def run_scan(cfg: BackdoorConfig, model_path: str | Path, out: str | Path, train_data: str | Path | None = None,
             truth: str | Path | None = None) -> dict[str, Any]:
    """Data-level detection of the training set the model was trained on.

    Args:
        cfg: the config (``[scan]``; ``[data]`` when ``train_data`` is not given).
        model_path: the trained model.
        out: the output folder (``scan.csv``: row, label, one score and one suspected column per method).
        train_data: an ``.npz`` (``x``, ``y``) — the training set to scan (default: ``[data]``'s training split).
        truth: a ``.npy`` bool mask of the truly poisoned rows (a self-test): each method's ROC AUC is added.

    Returns:
        ``scan.json``'s content.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = load_model(model_path, cfg)
    if train_data is not None:
        x, y = read_training_set(train_data)
    else:
        d = load_data(cfg.data)
        x, y = d.x_train, d.y_train
    scans = scan_data(model, x, y, cfg.scan, cfg.seed)
    rows = []
    for i in range(len(y)):
        r: dict[str, Any] = {"row": i, "label": int(y[i])}
        for s in scans:
            r[f"{s.method}_score"] = float(s.scores[i])
            r[f"{s.method}_suspected"] = bool(s.suspected[i])
        rows.append(r)
    write_csv(out / "scan.csv", rows)
    res: dict[str, Any] = {"model": str(model_path), "rows": len(y),
                           "methods": [{**s.summary(), "top": s.top(50).tolist()} for s in scans]}
    if truth is not None:
        mask = np.load(truth, allow_pickle=False).astype(bool)
        if len(mask) != len(y):
            raise DataError(f"{truth}: {len(mask)} rows, the training set has {len(y)}")
        for s, m in zip(scans, res["methods"], strict=True):
            m["auc"] = roc_auc(s.scores, mask)
            m["true_positives"] = int((s.suspected & mask).sum())
            m["poisoned_rows"] = int(mask.sum())
    atomic_write_json(out / "scan.json", res)
    return res


def run_mitigate(cfg: BackdoorConfig, model_path: str | Path, out: str | Path) -> Mitigation:
    """Repair the model (``cfg.mitigate.method``) and measure clean accuracy and ASR before and after.

    The ASR is measured with the attack's own trigger when the config has an ``[attack]`` (a self-test), and with
    Neural Cleanse's reversed trigger of the suspect class otherwise (what a defender without the trigger can
    measure). Writes ``model.safetensors`` (the repaired model) and ``mitigate.json``.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = load_model(model_path, cfg)
    data = load_data(cfg.data)
    (xd, yd), (xe, ye) = defender_split(data, cfg.seed)
    opts = cfg.mitigate
    nc = model_detectors(cfg.detect, box_of(data), cfg.seed)[0] or NeuralCleanse(clip=box_of(data), seed=cfg.seed)
    verdict = nc.detect(model, xd[: cfg.detect.clean_points], data.num_classes)
    reversed_trigger = nc.last.trigger(verdict.suspect_class, box_of(data))
    if cfg.attack is not None:
        attack = build_attack(cfg.attack, data, cfg.model, cfg.train, cfg.seed, cfg.device)
        effect = effect_of(attack.apply, xe, ye, attack.target)
        measured_with = f"the attack's trigger ({cfg.attack.name}, target {cfg.attack.target})"
    else:
        effect = effect_of(reversed_trigger.apply, xe, ye, verdict.suspect_class)
        measured_with = f"Neural Cleanse's reversed trigger of class {verdict.suspect_class}"
    ft = cfg.train.model_copy(update={"steps": opts.steps, "lr": opts.lr, "eval_every": opts.steps,
                                      "lr_schedule": []})
    if opts.method == "unlearning":
        rep = unlearn(model, reversed_trigger, xd, yd, xe, ye, fraction=opts.fraction, finetune=ft, seed=cfg.seed,
                      effect=effect)
    else:
        rep = fine_prune(model, xd, yd, xe, ye, max_drop=opts.max_drop, finetune=ft, seed=cfg.seed, effect=effect)
    rep.details.update({"asr_measured_with": measured_with, "neural_cleanse": verdict.to_dict()})
    meta = _model_meta(cfg, data, {"test_accuracy": rep.after["clean_accuracy"],
                                   "mitigated": {"method": rep.method, "from": str(model_path)}})
    save_state_dict(out / "model.safetensors", {k: v.cpu() for k, v in rep.model.state_dict().items()}, meta)
    atomic_write_json(out / "mitigate.json", rep.to_dict())
    return rep


def attack_names() -> list[str]:
    """The registered attack names."""
    return ATTACKS.names()


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, default=str)
