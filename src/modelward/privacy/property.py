"""Reconstruction-based property inference (seed 002 §8.5, Algorithm 8.4, App. D) and overt encoding (§8.6).

Property = a **watermark** stamped (statically) on 80 % of a model's training images. From a universe of
watermarks (thesis: 30 Diceware words, |P| = 14 per experiment) each shadow model gets one; its reconstructions
(model inversion, Eq. 8.1: 64 per model, 128 ℓ2-normalised steps from a blank image, random target classes) form a
*set*, and a permutation-invariant meta-classifier learns to name the watermark from the set (Alg. 8.4; 80/20 split
over models; F1). Downsized for small data (digest §10.3): watermarks are random binary glyphs, white on a black
border, in the top-left corner (8×8 digits cannot hold text); the meta-classifier is a DeepSets net (per-image MLP
→ mean + max pool → MLP → multi-label head) instead of ResNet18 + Set Transformer. Target trainers: standard,
PGD-ℓ2 adversarial training and GloRo (MinMax) from :mod:`modelward.robustness`.

Overt encoding (§8.6, Eq. 8.13–8.14): a first-layer unit w_i = −2c, b_i = ‖c‖² computes ‖x − c‖² − ‖x‖², so weight
columns can be centroids — of classes, or of single training points when the layer is wide. :func:`column_matches`
pairs every first-layer weight column with its most SSIM-similar training image and sorts the pairs (Fig. 8.17);
:func:`centroid_similarity` measures how close columns are to class centroids. (The black-box hyperplane recovery
of §8.6.2 is not implemented.)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from modelward.core.config import StrictModel, dump_config
from modelward.core.data import DataConfig, load_data
from modelward.core.init import init_model_
from modelward.core.progress import ProgressSink, as_sink
from modelward.core.records import atomic_write_json, write_table
from modelward.core.similarity import ssim  # (in core: the governance input-leakage audit scores with it)
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError
from modelward.privacy.figures import image_grid
from modelward.privacy.inversion import Loss, invert
from modelward.privacy.shadows import ModelTrainer
from modelward.robustness.gloro.layers import build_gloro_model
from modelward.robustness.gloro.net import GloroNet
from modelward.robustness.gloro.train import GloroTrainConfig, train_gloro
from modelward.robustness.training import AdversarialConfig, pgd_adversarial_training

TrainerKind = Literal["standard", "pgd", "gloro"]


# ---------------------------------------------------------------------------------------------------------------
# watermarks
def watermark_universe(count: int, image_shape: tuple[int, ...], glyph: int = 3, seed: int = 0) -> torch.Tensor:
    """``count`` distinct watermarks as (count, C, H, W) masks with values: 1 = white glyph pixel, 0 = black
    border, NaN = untouched. Each glyph is a random ``glyph``×``glyph`` binary pattern (≥ 3 pixels on) placed at the
    top-left corner inside a one-pixel black border."""
    if len(image_shape) != 3:
        raise ConfigError(f"watermarks need image data (C×H×W), got input shape {image_shape}")
    c, h, w = image_shape
    if glyph + 2 > min(h, w):
        raise ConfigError(f"watermark glyph {glyph} (+ border) does not fit {h}×{w} images")
    rng = np.random.default_rng(seed)
    seen: set[bytes] = set()
    out = torch.full((count, c, h, w), float("nan"))
    tries = 0
    while len(seen) < count:
        tries += 1
        if tries > 100_000:
            raise ConfigError(f"cannot draw {count} distinct {glyph}×{glyph} glyphs; use a larger glyph")
        g = rng.random((glyph, glyph)) < 0.5
        if g.sum() < 3 or g.tobytes() in seen:
            continue
        k = len(seen)
        seen.add(g.tobytes())
        out[k, :, : glyph + 2, : glyph + 2] = 0.0
        out[k, :, 1: glyph + 1, 1: glyph + 1] = torch.as_tensor(g, dtype=torch.float32)
    return out


def stamp(x: torch.Tensor, mark: torch.Tensor, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stamp ``mark`` on a fixed random ``fraction`` of ``x`` (static augmentation); returns (images, stamped mask)."""
    n = len(x)
    k = int(round(fraction * n))
    chosen = torch.zeros(n, dtype=torch.bool)
    chosen[torch.as_tensor(np.random.default_rng(seed).choice(n, k, replace=False), dtype=torch.long)] = True
    out = x.clone()
    keep = torch.isnan(mark)
    out[chosen] = torch.where(keep, out[chosen], torch.nan_to_num(mark))
    return out, chosen


# ---------------------------------------------------------------------------------------------------------------
# configuration
class PropertyTrainConfig(StrictModel):
    """Target/shadow trainer (thesis: dense nets, Adam lr 1e-3, batch 64, 30 epochs; PGD / GloRo with ℓ2 ε)."""

    kind: TrainerKind = "standard"
    hidden: list[int] = Field(default_factory=lambda: [256, 256])
    epochs: int = Field(30, ge=1)
    batch_size: int = Field(64, ge=1)
    lr: float = Field(1e-3, gt=0.0)
    epsilon: float = Field(0.45, ge=0.0)  # ℓ2 radius for pgd / gloro
    pgd_steps: int = Field(7, ge=1)


class InversionConfig(StrictModel):
    reconstructions: int = Field(64, ge=1)
    steps: int = Field(128, ge=0)
    step_size: float = Field(0.05, gt=0.0)  # thesis 0.001 on unit-norm LFW images; digits live in [0, 1]^64
    x0: float = 0.0
    loss: Loss = "cross_entropy"
    box: tuple[float, float] | None = (0.0, 1.0)


class MetaConfig(StrictModel):
    hidden: int = Field(128, ge=1)
    epochs: int = Field(100, ge=1)
    lr: float = Field(1e-3, gt=0.0)
    weight_decay: float = Field(0.01, ge=0.0)
    batch_size: int = Field(16, ge=1)


class PropertyConfig(StrictModel):
    """``modelward privacy property``: watermark property inference on one image data set.

    Args:
        name / seed: the study's name and seed.
        data: the image data source (default ``digits``).
        universe: number of candidate glyph properties; properties: how many of them are embedded
            (must not exceed ``universe``).
        glyph: glyph size in pixels; fraction: share of images carrying the property.
        subsample: each shadow model trains on this share of the train split.
        shadow_models: number of shadow models (≥ 5); test_fraction: share held out to score the meta-classifier.
        trainers: target training kinds (``standard`` / ``pgd`` / ``gloro``).
        train / inversion / meta: the target training, inversion and meta-classifier settings.

    Returns:
        A strict config for :func:`run_property`.

    Example:
        >>> cfg = PropertyConfig(shadow_models=8, trainers=["standard"])
        >>> cfg.universe, cfg.properties
        (30, 14)
    """

    name: str = "property"
    seed: int = 0
    data: DataConfig = Field(default_factory=lambda: DataConfig(source="digits"))
    universe: int = Field(30, ge=2)
    properties: int = Field(14, ge=2)
    glyph: int = Field(3, ge=1)
    fraction: float = Field(0.8, gt=0.0, le=1.0)
    subsample: float = Field(0.5, gt=0.0, le=1.0)  # each shadow trains on this share of the train split
    shadow_models: int = Field(128, ge=5)
    test_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    trainers: list[TrainerKind] = Field(default_factory=lambda: ["standard"])
    train: PropertyTrainConfig = Field(default_factory=PropertyTrainConfig)
    inversion: InversionConfig = Field(default_factory=InversionConfig)
    meta: MetaConfig = Field(default_factory=MetaConfig)


# ---------------------------------------------------------------------------------------------------------------
# targets
def train_target(kind: TrainerKind, cfg: PropertyTrainConfig, x: torch.Tensor, y: torch.Tensor, num_classes: int,
                 seed: int) -> nn.Module:
    """One dense model trained with ``kind`` ∈ standard / pgd / gloro; returns the logit model (GloRo: ``net.f``)."""
    shape = tuple(x.shape[1:])
    steps = max(1, cfg.epochs * max(1, len(x) // cfg.batch_size))
    tcfg = TrainConfig(optimizer="adam", lr=cfg.lr, batch_size=cfg.batch_size, steps=steps, weight_decay=0.0,
                       eval_every=steps)
    if kind == "standard":
        return ModelTrainer(lambda: build_model(ModelConfig(arch="mlp", hidden=cfg.hidden), shape, num_classes),
                            tcfg).train(x, y, seed)
    if kind == "pgd":
        model = init_model_(build_model(ModelConfig(arch="mlp", hidden=cfg.hidden), shape, num_classes),
                            "glorot_uniform", seed)
        adv = AdversarialConfig(eps=cfg.epsilon, norm="l2", attack_steps=cfg.pgd_steps, clip=(0.0, 1.0))
        pgd_adversarial_training(model, x, y, tcfg, adv, seed)
        return model.eval()
    if kind == "gloro":
        spec = ".".join(f"d({h + h % 2})" for h in cfg.hidden)
        model = build_gloro_model(spec, shape, num_classes, "minmax", seed=seed)
        net = GloroNet(model, shape, cfg.epsilon, seed=seed)
        gcfg = GloroTrainConfig(epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr, epsilon=cfg.epsilon,
                                loss="crossentropy", lr_decay_to=None)
        train_gloro(net, x, y, gcfg, seed)
        return net.f.eval()
    raise ConfigError(f"trainer kind {kind!r}: valid choices: standard, pgd, gloro")


def reconstructions(model: nn.Module, cfg: InversionConfig, input_shape: tuple[int, ...], num_classes: int,
                    seed: int) -> torch.Tensor:
    """App. D.1: ``reconstructions`` inversions of random classes from a constant seed image."""
    g = torch.Generator().manual_seed(seed)
    targets = torch.randint(0, num_classes, (cfg.reconstructions,), generator=g)
    return invert(model, targets, x0=cfg.x0, input_shape=input_shape, steps=cfg.steps, step_size=cfg.step_size,
                  loss=cfg.loss, box=cfg.box).x


# ---------------------------------------------------------------------------------------------------------------
# meta-classifier
class SetClassifier(nn.Module):
    """DeepSets: φ per image (2-layer MLP) → [mean, max] pooling → ρ (MLP) → |P| logits (multi-label head)."""

    def __init__(self, d_in: int, hidden: int, n_out: int) -> None:
        super().__init__()
        self.phi = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.rho = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ReLU(), nn.Linear(hidden, n_out))

    def forward(self, sets: torch.Tensor) -> torch.Tensor:  # (B, R, D)
        h = self.phi(sets)
        return self.rho(torch.cat([h.mean(1), h.amax(1)], -1))


def f1_scores(pred: np.ndarray, true: np.ndarray) -> dict[str, float]:
    """Micro and macro F1 of multi-label 0/1 predictions (the thesis does not state its averaging)."""
    tp = (pred & true).sum(0).astype(float)
    fp = (pred & ~true).sum(0).astype(float)
    fn = (~pred & true).sum(0).astype(float)
    micro = 2 * tp.sum() / max(2 * tp.sum() + fp.sum() + fn.sum(), 1e-12)
    per = np.where(2 * tp + fp + fn > 0, 2 * tp / np.maximum(2 * tp + fp + fn, 1e-12), np.nan)
    return {"f1_micro": float(micro), "f1_macro": float(np.nanmean(per)) if np.isfinite(per).any() else 0.0}


def decode(logits: torch.Tensor) -> np.ndarray:
    """Multi-label decision: every property with probability > ½, and at least the most likely one (in the game
    of Def. 8.2 every model carries one property, so predicting the empty set is never right)."""
    pred = (logits > 0).numpy()
    pred[np.arange(len(pred)), logits.argmax(1).numpy()] = True
    return pred


def fit_meta(sets: torch.Tensor, labels: torch.Tensor, cfg: MetaConfig, n_out: int, seed: int) -> SetClassifier:
    torch_gen = torch.Generator().manual_seed(seed)
    meta = SetClassifier(sets.shape[-1], cfg.hidden, n_out)
    with torch.no_grad():
        for p in meta.parameters():
            bound = 1 / max(p.shape[-1], 1) ** 0.5
            p.uniform_(-bound, bound, generator=torch_gen)
    opt = torch.optim.Adam(meta.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    target = F.one_hot(labels, n_out).float()
    for _ in range(cfg.epochs):
        perm = torch.randperm(len(sets), generator=torch_gen)
        for i in range(0, len(sets), cfg.batch_size):
            b = perm[i:i + cfg.batch_size]
            loss = F.binary_cross_entropy_with_logits(meta(sets[b]), target[b])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return meta.eval()


@dataclass(frozen=True)
class PropertyResult:
    trainer: str
    shadow_models: int
    test_models: int
    f1_micro: float
    f1_macro: float
    top1_accuracy: float
    train_f1_micro: float
    chance_top1: float
    mean_model_accuracy: float

    def as_dict(self) -> dict[str, float | int | str]:
        return dict(vars(self))


def run_property(cfg: PropertyConfig, out: Path, progress: ProgressSink | None = None) -> list[PropertyResult]:
    """Algorithm 8.4 for each trainer in ``cfg.trainers``; writes results.{csv,md,json} and image grids to ``out``.

    Args:
        cfg: :class:`PropertyConfig`; out: the output folder; progress: one unit per shadow model.
    Returns:
        one :class:`PropertyResult` per trainer (F1 on the held-out 20 % of shadow models).

    Example:
        >>> from pathlib import Path
        >>> results = run_property(PropertyConfig(shadow_models=8), Path("property-out"))  # doctest: +SKIP
    """
    if cfg.properties > cfg.universe:
        raise ConfigError(f"properties ({cfg.properties}) cannot exceed the universe ({cfg.universe})")
    out.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, out / "config.json")
    data = load_data(cfg.data)
    shape = data.input_shape
    universe = watermark_universe(cfg.universe, shape, cfg.glyph, cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    chosen = rng.choice(cfg.universe, cfg.properties, replace=False)
    marks = universe[torch.as_tensor(chosen)]
    image_grid(out / "watermarks.png", torch.nan_to_num(marks, nan=0.5), [f"P{i}" for i in range(len(marks))],
               title="watermark properties (grey = untouched)")
    labels = torch.as_tensor(rng.integers(0, cfg.properties, cfg.shadow_models))
    n_test = max(1, int(round(cfg.test_fraction * cfg.shadow_models)))
    results = []
    sink = as_sink(progress)
    for kind in cfg.trainers:
        sink.start(kind, cfg.shadow_models, f"{kind} shadow models")
        sets, accs = [], []
        for i in range(cfg.shadow_models):
            seed = cfg.seed * 100_003 + i
            sub = torch.as_tensor(np.random.default_rng(seed).choice(
                len(data.x_train), max(2, int(round(cfg.subsample * len(data.x_train)))), replace=False))
            xs, _ = stamp(data.x_train[sub], marks[labels[i]], cfg.fraction, seed)
            model = train_target(kind, cfg.train, xs, data.y_train[sub], data.num_classes, seed)
            with torch.no_grad():
                accs.append(float((model(data.x_test).argmax(1) == data.y_test).float().mean()))
            rec = reconstructions(model, cfg.inversion, shape, data.num_classes, seed)
            sets.append(rec.reshape(len(rec), -1))
            if i < 4:  # a few grids a person can look at
                image_grid(out / f"reconstructions_{kind}_model{i}.png", rec[:16], ncol=8,
                           title=f"{kind} model {i}: watermark P{int(labels[i])}")
            sink.advance(kind)
        S = torch.stack(sets)
        tr, te = slice(0, cfg.shadow_models - n_test), slice(cfg.shadow_models - n_test, None)
        meta = fit_meta(S[tr], labels[tr], cfg.meta, cfg.properties, cfg.seed)
        with torch.no_grad():
            lt, ltr = meta(S[te]), meta(S[tr])
        onehot = F.one_hot(labels, cfg.properties).numpy().astype(bool)
        f1 = f1_scores(decode(lt), onehot[te])
        f1_tr = f1_scores(decode(ltr), onehot[tr])
        top1 = float((lt.argmax(1) == labels[te]).float().mean())
        results.append(PropertyResult(kind, cfg.shadow_models, n_test, f1["f1_micro"], f1["f1_macro"], top1,
                                      f1_tr["f1_micro"], 1.0 / cfg.properties, float(np.mean(accs))))
        sink.done(kind, f"F1 {results[-1].f1_micro:.3f}")
    rows = [r.as_dict() for r in results]
    write_table(out, "results", rows, title=f"{cfg.name}: watermark property inference (Alg. 8.4)",
                notes=["F1 on held-out shadow models (multi-label: p > ½, plus the argmax); top-1 = argmax names the watermark",
                       f"{cfg.properties} properties out of {cfg.universe}; {cfg.fraction:.0%} of images stamped"])
    atomic_write_json(out / "summary.json", rows)
    return results


# ---------------------------------------------------------------------------------------------------------------
# overt encoding (§8.6)
def first_layer_columns(model: nn.Module, input_shape: tuple[int, ...]) -> torch.Tensor:
    """The first linear layer's weight columns (one per unit) reshaped to input images (Fig. 8.17)."""
    lin = next((m for m in model.modules() if isinstance(m, nn.Linear)), None)
    if lin is None:
        raise ConfigError("overt-encoding analysis needs a model whose first layer is nn.Linear (a dense net)")
    return lin.weight.detach().reshape(lin.out_features, *input_shape)


def _minmax(t: torch.Tensor) -> torch.Tensor:
    flat = t.flatten(1)
    lo, hi = flat.min(1, keepdim=True).values, flat.max(1, keepdim=True).values
    return ((flat - lo) / (hi - lo).clamp_min(1e-12)).view_as(t)


@dataclass(frozen=True)
class ColumnMatch:
    unit: int
    train_index: int
    ssim: float
    sign: int  # +1: the column itself matches; −1: its negation (w_i = −2c, Eq. 8.14)


def column_matches(model: nn.Module, x_train: torch.Tensor, top: int | None = None) -> list[ColumnMatch]:
    """For each first-layer column (and its negation), the training image with the highest SSIM (both min-max
    scaled to [0, 1]); sorted by SSIM, best first (§8.6.3)."""
    cols = first_layer_columns(model, tuple(x_train.shape[1:]))
    imgs = _minmax(x_train)
    out = []
    for i, col in enumerate(cols):
        best = (-2.0, -1, 1)
        for sign in (1, -1):
            c = _minmax((sign * col)[None]).expand_as(imgs)
            s = ssim(c, imgs, data_range=1.0)
            j = int(s.argmax())
            if float(s[j]) > best[0]:
                best = (float(s[j]), j, sign)
        out.append(ColumnMatch(i, best[1], best[0], best[2]))
    out.sort(key=lambda m: -m.ssim)
    return out[:top] if top else out


def centroid_similarity(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """Per first-layer unit, the largest cosine similarity between −w_i and a centred class centroid (Eq. 8.14:
    w_i = −2c makes the unit a squared distance to c)."""
    cols = first_layer_columns(model, tuple(x.shape[1:])).flatten(1).double()
    xf = x.flatten(1).double()
    mean = xf.mean(0)
    cents = torch.stack([xf[y == c].mean(0) - mean for c in torch.unique(y)])
    sim = F.normalize(-cols, dim=1) @ F.normalize(cents, dim=1).T
    return sim.max(1).values.numpy()
