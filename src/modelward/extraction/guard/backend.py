"""The guard's model backend: local weights (direct mode) or a model server (proxy mode, :mod:`.proxy`).

:func:`open_model` gives the service the ``nn.Module`` it runs and the device it runs on; the service does not know
which kind it has (the defense, the watermark, the detector and the log are the same in both modes).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from modelward.core.device import resolve_device
from modelward.core.io import load_into, load_state_dict
from modelward.core.sources import adapt_state_dict
from modelward.core.zoo import build_model
from modelward.errors import ConfigError, DataError
from modelward.extraction.guard.config import GuardConfig
from modelward.extraction.guard.proxy import UpstreamModel


def load_weights(model: nn.Module, path: Path, field: str) -> None:
    """Load a safetensors state dict into ``model`` (eval mode) through the project's one strict loader
    (:func:`modelward.core.io.load_into`: names, shapes, dtypes — no F16/I64/BOOL cast — and finite values; a model
    with NaN/inf weights answers NaN, which every request would see as its own fault); ConfigError naming
    ``field``."""
    try:
        state, _ = load_state_dict(path)
        load_into(model, adapt_state_dict(model, state), path)  # a Hugging Face model.safetensors: its own names
    except DataError as e:
        raise ConfigError(f"{field}: {e}") from None
    model.eval()


def open_model(cfg: GuardConfig, base_dir: Path) -> tuple[nn.Module, torch.device]:
    """The served model and its device: ``[model]``'s architecture with its checkpoint's weights, or, with
    ``[upstream]``, an :class:`~modelward.extraction.guard.proxy.UpstreamModel` (no weights here; CPU).

    Args:
        cfg: the validated guard config.
        base_dir: the config file's folder (relative paths).

    Returns:
        ``(model, device)``, the model in eval mode on its device.

    Example:
        >>> model, device = open_model(load_guard_config("guard.toml"), Path("."))  # doctest: +SKIP
    """
    shape, k = tuple(cfg.model.input_shape), cfg.model.num_classes
    if cfg.upstream is not None:
        return UpstreamModel(cfg.upstream, base_dir, shape, k).eval(), torch.device("cpu")
    assert cfg.model.checkpoint is not None  # GuardConfig requires one without [upstream]
    model = build_model(cfg.model.net, shape, k)
    load_weights(model, base_dir / cfg.model.checkpoint, "model.checkpoint")
    device = resolve_device(cfg.model.device)  # an unusable device is refused before serving
    return model.to(device), device
