"""The model under assessment: its weights, architecture, data and training recipe, loaded once per section.

Sections run as separate runs of the shared runner (possibly in other processes), so each rebuilds the target
from the config with :func:`load_target`; nothing is passed between them in memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from modelward.assess.config import AssessConfig
from modelward.core.checkpoint import Checkpoint, checkpoint_kind, load_checkpoint, read_checkpoint
from modelward.core.data import DataConfig, DataSplit, load_data
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError, DataError


@dataclass
class Target:
    """What every section needs.

    Attributes:
        model: the classifier (logits), in eval mode.
        data: the data it was trained on (``x_train`` are the members, ``x_test`` held out).
        factory: a fresh, untrained model of the same architecture (shadow models, completion originals).
        gloro: the GloRo net when the checkpoint is a ``modelward robust train`` model, else None.
        kind: "zoo", "gloro" or "entrypoint".
        description: one line for the report.
    """

    model: nn.Module
    data: DataSplit
    factory: Callable[[], nn.Module]
    model_cfg: ModelConfig | None
    gloro: nn.Module | None
    kind: str
    description: str


def load_target(cfg: AssessConfig) -> Target:
    """Load the model and data an assessment config names (see :class:`~modelward.assess.config.AssessConfig`)."""
    tensors: dict[str, torch.Tensor] = {}
    meta: dict = {}
    if cfg.checkpoint:
        tensors, meta = read_checkpoint(Path(cfg.checkpoint))
        if checkpoint_kind(tensors, meta) == "gloro":  # a `modelward robust train` model
            return _gloro_target(cfg, load_checkpoint(Path(cfg.checkpoint), kinds=("gloro",)))
    data_cfg = cfg.data or (DataConfig.model_validate(meta["data"]) if "data" in meta else DataConfig())
    data = load_data(data_cfg)
    model_cfg = cfg.model or (ModelConfig.model_validate(meta["model"]) if "model" in meta else None)
    if model_cfg is None:
        raise ConfigError(f"{cfg.checkpoint}: its metadata does not say the architecture; add a [model] table "
                          "(as in the config the model was trained with)")

    def factory() -> nn.Module:
        return build_model(model_cfg, data.input_shape, data.num_classes)

    model = factory()
    if tensors:
        try:
            model.load_state_dict(tensors)
        except RuntimeError as e:
            raise DataError(f"{cfg.checkpoint}: weights do not match [model] {model_cfg.arch} for "
                            f"{data.describe()} ({str(e).splitlines()[0]})") from None
    model.eval()
    kind = "entrypoint" if model_cfg.arch == "entrypoint" else "zoo"
    n_params = sum(p.numel() for p in model.parameters())
    return Target(model, data, factory, model_cfg, None, kind,
                  f"{model_cfg.arch} ({n_params:,} parameters) on {data.describe()}")


def _gloro_target(cfg: AssessConfig, ck: Checkpoint) -> Target:
    # imported here: only GloRo targets need the robustness area (its import is heavy)
    from modelward.robustness.gloro.layers import build_gloro_model

    net, rcfg, meta = ck.wrapper, ck.config, ck.meta
    assert net is not None
    data = load_data(cfg.data or rcfg.data)
    shape, m = tuple(meta["input_shape"]), int(meta["num_classes"])
    if tuple(data.input_shape) != shape or data.num_classes != m:
        raise ConfigError(f"data: {data.describe()} does not match the GloRo model (input {shape}, {m} classes)")

    def factory() -> nn.Module:
        return build_gloro_model(rcfg.model.arch, shape, m, rcfg.model.activation, rcfg.model.init, rcfg.seed)

    model = net.f
    model.eval()
    n_params = sum(p.numel() for p in model.parameters())
    return Target(model, data, factory, None, net, "gloro",
                  f"GloRo net {rcfg.model.arch!r} ({n_params:,} parameters, trained at ε = {net.epsilon}) on "
                  f"{data.describe()}")
