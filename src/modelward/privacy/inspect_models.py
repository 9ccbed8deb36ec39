"""``modelward privacy invert``: model inversion grids (Eq. 8.1, §8.5 visual inspection) and the overt-encoding
analysis of §8.6 (weight columns ↔ most SSIM-similar training images, class-centroid alignment) for models trained
standard / PGD-ℓ2 / GloRo on (optionally watermarked) image data, or for a saved zoo model (``model_path``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from pydantic import Field

from modelward.core.config import StrictModel, dump_config
from modelward.core.data import DataConfig, load_data
from modelward.core.io import load_into, load_state_dict
from modelward.core.progress import ProgressSink, as_sink
from modelward.core.records import write_table
from modelward.core.zoo import ModelConfig, build_model, model_config_from_metadata
from modelward.errors import ConfigError, DataError
from modelward.privacy.figures import image_grid
from modelward.privacy.inversion import invert
from modelward.privacy.property import (
    InversionConfig,
    PropertyTrainConfig,
    TrainerKind,
    centroid_similarity,
    column_matches,
    first_layer_columns,
    stamp,
    train_target,
    watermark_universe,
)


class InvertConfig(StrictModel):
    name: str = "invert"
    seed: int = 0
    data: DataConfig = Field(default_factory=lambda: DataConfig(source="digits"))
    trainers: list[TrainerKind] = Field(default_factory=lambda: ["standard", "pgd"])
    train: PropertyTrainConfig = Field(default_factory=PropertyTrainConfig)
    watermark: bool = True  # stamp one watermark on `fraction` of the training images (§8.5 "#privacy")
    fraction: float = Field(0.8, gt=0.0, le=1.0)
    glyph: int = Field(3, ge=1)
    max_train: int | None = Field(None, ge=10)  # a small training subset makes columns match single images
    inversion: InversionConfig = Field(default_factory=lambda: InversionConfig(steps=200, x0=0.5))
    model_path: str | None = None  # invert a saved zoo model (safetensors from `modelward train`) instead
    model: ModelConfig | None = None  # its architecture (else read from the file's metadata)
    matches: int = Field(16, ge=1)


def _saved_model(cfg: InvertConfig, shape: tuple[int, ...], classes: int) -> torch.nn.Module:
    p = Path(cfg.model_path or "")
    if not p.is_file():
        raise DataError(f"model_path {p}: file not found")
    state, meta = load_state_dict(p)
    mcfg = cfg.model or (model_config_from_metadata(meta["model"], str(p)) if "model" in meta else None)
    if mcfg is None:
        raise ConfigError(f"model_path {p}: no architecture in its metadata; add a [model] table")
    m = build_model(mcfg, shape, classes)
    load_into(m, state, p)
    return m.eval()


def run_invert(cfg: InvertConfig, out: Path, progress: ProgressSink | None = None) -> list[dict]:
    """Train (or load) each model, write ``inversions_<kind>.png`` (one reconstruction per class),
    ``columns_<kind>.png`` (best weight-column ↔ training-image pairs), and ``results.csv/md/json``."""
    out.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, out / "config.json")
    data = load_data(cfg.data)
    if not data.is_image:
        raise ConfigError(f"privacy invert needs image data; {data.name} has input shape {data.input_shape}")
    shape, classes = data.input_shape, data.num_classes
    x, y = data.x_train, data.y_train
    if cfg.max_train is not None and len(x) > cfg.max_train:
        idx = torch.as_tensor(np.random.default_rng(cfg.seed).choice(len(x), cfg.max_train, replace=False))
        x, y = x[idx], y[idx]
    if cfg.watermark:
        mark = watermark_universe(1, shape, cfg.glyph, cfg.seed)[0]
        x, _ = stamp(x, mark, cfg.fraction, cfg.seed)
        image_grid(out / "watermark.png", torch.nan_to_num(mark, nan=0.5)[None], ["watermark"])
    kinds = ["saved"] if cfg.model_path else list(cfg.trainers)
    sink = as_sink(progress)
    sink.start("models", len(kinds), "models")
    rows = []
    for kind in kinds:
        model = (_saved_model(cfg, shape, classes) if kind == "saved"
                 else train_target(kind, cfg.train, x, y, classes, cfg.seed))  # type: ignore[arg-type]
        acc = float((model(data.x_test).argmax(1) == data.y_test).float().mean())
        inv = cfg.inversion
        rec = invert(model, list(range(classes)), x0=inv.x0, input_shape=shape, steps=inv.steps,
                     step_size=inv.step_size, loss=inv.loss, box=inv.box)
        image_grid(out / f"inversions_{kind}.png", rec.x, [f"class {c}: {p:.2f}" for c, p in
                                                           enumerate(rec.confidence.tolist())],
                   ncol=min(10, classes), title=f"{kind}: one reconstruction per class (Eq. 8.1)")
        row = {"model": kind, "test_accuracy": acc, "mean_confidence": float(rec.confidence.mean())}
        if cfg.watermark:
            # how much of the watermark's glyph region the reconstructions light up (white glyph pixels)
            glyph = (torch.nan_to_num(mark, nan=-1) == 1).expand_as(rec.x)
            border = (torch.nan_to_num(mark, nan=-1) == 0).expand_as(rec.x)
            row["glyph_minus_border"] = float(rec.x[glyph].mean() - rec.x[border].mean())
        try:
            matches = column_matches(model, x, top=cfg.matches)
            cols = first_layer_columns(model, shape)
            pairs = []
            for m in matches:
                pairs += [m.sign * cols[m.unit], x[m.train_index]]
            image_grid(out / f"columns_{kind}.png", torch.stack(pairs),
                       [t for m in matches for t in (f"unit {m.unit}", f"SSIM {m.ssim:.2f}")], ncol=8,
                       title=f"{kind}: first-layer columns and their most similar training images (§8.6.3)")
            cs = centroid_similarity(model, x, y)
            row |= {"best_column_ssim": matches[0].ssim, f"mean_top{cfg.matches}_ssim":
                    float(np.mean([m.ssim for m in matches])), "median_centroid_cosine": float(np.median(cs))}
        except ConfigError:
            pass  # not a dense first layer: no column analysis
        rows.append(row)
        sink.advance("models", info=kind)
    sink.done("models")
    write_table(out, "results", rows, title=f"{cfg.name}: inversion and overt encoding",
                notes=["glyph_minus_border > 0: reconstructions draw the (white) watermark glyph over its black border",
                       "best_column_ssim: the highest SSIM between a first-layer weight column (or its negation) and a "
                       "training image"])
    return rows
