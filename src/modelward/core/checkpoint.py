"""One reader for the project's model checkpoints: safetensors files whose metadata says how to rebuild them.

Every checkpoint the project writes is a safetensors file (:mod:`modelward.core.io`; never a pickle) whose
metadata carries the architecture. The metadata key ``kind`` names the format, and :data:`CHECKPOINT_KINDS` (a
:class:`~modelward.core.registry.Registry`) maps it to the loader that owns that format:

- ``"zoo"``: a ``modelward train`` model (metadata ``model``, ``input_shape``, ``num_classes``);
- ``"gloro"``: a ``modelward robust train`` model (metadata ``config``; tensors ``f.*`` and ``iterates.*``),
  loaded by :func:`modelward.robustness.experiment.load_model` (its logit model ``f`` and the GloRo net).

A file written before the ``kind`` key existed is recognised by the keys its format always had (``config`` with
``f.*`` tensors: gloro; ``model``: zoo); :func:`checkpoint_kind` is that rule. A file with neither is ``"weights"``:
a bare state dict that only loads into an architecture the caller names (:func:`load_weights`).

Example:
    >>> import tempfile, torch
    >>> from pathlib import Path
    >>> from modelward.core.io import save_state_dict
    >>> from modelward.core.zoo import ModelConfig, build_model, model_config_from_metadata
    >>> mcfg = ModelConfig(arch="mlp", hidden=[8])
    >>> path = Path(tempfile.mkdtemp()) / "m.safetensors"
    >>> save_state_dict(path, build_model(mcfg, (4,), 3).state_dict(),
    ...                 {"kind": "zoo", "model": mcfg.model_dump(mode="json"), "input_shape": [4], "num_classes": 3})
    >>> ck = load_checkpoint(path)
    >>> ck.kind, ck.model(torch.zeros(2, 4)).shape
    ('zoo', torch.Size([2, 3]))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from modelward.core.device import resolve_device
from modelward.core.io import load_into, load_state_dict
from modelward.core.registry import Registry
from modelward.core.zoo import build_model, model_config_from_metadata
from modelward.errors import DataError

__all__ = ["CHECKPOINT_KINDS", "Checkpoint", "checkpoint_kind", "checkpoint_path", "load_checkpoint",
           "load_weights", "read_checkpoint"]


@dataclass
class Checkpoint:
    """A loaded model and what its file said about it.

    Attributes:
        kind: the format (``"zoo"``, ``"gloro"``, ...).
        model: the classifier returning logits, in eval mode, on the requested device.
        meta: the file's metadata.
        path: the file read.
        config: the format's own config (a zoo ``ModelConfig``; the gloro run's ``RobustConfig``).
        wrapper: the module the format trains (the ``GloroNet`` around ``model``), or None.
    """

    kind: str
    model: nn.Module
    meta: dict[str, Any]
    path: Path
    config: Any = None
    wrapper: nn.Module | None = None


# loader(path, tensors, meta, device) -> Checkpoint; each kind owns its format
Loader = Callable[[Path, dict[str, torch.Tensor], dict[str, Any], torch.device], Checkpoint]
CHECKPOINT_KINDS = Registry("checkpoint kind")


def checkpoint_path(path: str | Path) -> Path:
    """The file a checkpoint argument names: a run directory means its ``model.safetensors``."""
    p = Path(path)
    return p / "model.safetensors" if p.is_dir() else p


def read_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Tensors and metadata of a checkpoint file (or run directory), without building anything.

    Raises:
        DataError: the file does not exist, or is not a safetensors file.
    """
    p = checkpoint_path(path)
    if not p.is_file():
        raise DataError(f"{p}: checkpoint not found")
    return load_state_dict(p)


def checkpoint_kind(tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> str:
    """The format of a checkpoint: its ``kind`` metadata key, else the legacy rule (``config`` + ``f.*`` tensors:
    ``"gloro"``; ``model``: ``"zoo"``; otherwise ``"weights"``, a bare state dict).

    Raises:
        DataError: a ``kind`` no loader is registered for (the message lists the known kinds).
    """
    kind = meta.get("kind")
    if kind is not None:
        if kind not in CHECKPOINT_KINDS:
            raise DataError(f"checkpoint kind {kind!r}: no loader for it; known kinds: {CHECKPOINT_KINDS.names()}")
        return str(kind)
    if "config" in meta and any(k.startswith("f.") for k in tensors):
        return "gloro"
    return "zoo" if "model" in meta else "weights"


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu",
                    kinds: tuple[str, ...] | None = None) -> Checkpoint:
    """Rebuild the model a checkpoint file (or run directory) describes, on `device`, in eval mode.

    Args:
        path: a safetensors checkpoint, or a run directory holding ``model.safetensors``.
        device: where the model goes (a device setting, see :func:`~modelward.core.device.resolve_device`).
        kinds: the formats the caller accepts (default: any registered one).

    Returns:
        A :class:`Checkpoint`.

    Raises:
        DataError: missing file, no architecture in the metadata, a kind not accepted, or weights that do not
            match the architecture.
    """
    p = checkpoint_path(path)
    tensors, meta = read_checkpoint(p)
    kind = checkpoint_kind(tensors, meta)
    if kind == "weights":
        raise DataError(f"{p}: no architecture in its metadata (write it with 'modelward train' or "
                        "'modelward robust train')")
    if kinds is not None and kind not in kinds:
        raise DataError(f"{p}: a {kind!r} checkpoint; expected {' or '.join(repr(k) for k in kinds)}")
    loader: Loader = CHECKPOINT_KINDS.get(kind)
    return loader(p, tensors, meta, resolve_device(device))


def load_weights(model: nn.Module, tensors: Mapping[str, torch.Tensor], what: str,
                 error: type[Exception] = DataError) -> nn.Module:
    """Load a state dict into an architecture the caller built; eval mode.

    Args:
        model: the architecture; tensors: its weights; what: names the file or field in the error.
        error: the error class raised on a mismatch (``ConfigError`` where a config field named the file).

    Returns:
        `model`, loaded and in eval mode.
    """
    try:  # names, shapes, dtypes and finite values, all named (core.io.load_into: the one strict loader)
        load_into(model, tensors, what)
    except DataError as e:
        raise error(str(e)) from None
    return model.eval()


@CHECKPOINT_KINDS.register("zoo")
def load_zoo(path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any], device: torch.device) -> Checkpoint:
    """A ``modelward train`` model: the zoo architecture of its ``model`` metadata."""
    if "model" not in meta:
        raise DataError(f"{path}: no architecture in its metadata (write it with 'modelward train' or "
                        "'modelward robust train')")
    # a file is data: an entry point it names runs only if the user trusts it, whatever the file claims
    mcfg = model_config_from_metadata(meta["model"], f"{path} (embedded model config)")
    model = build_model(mcfg, tuple(meta["input_shape"]), int(meta["num_classes"]))
    load_into(model, tensors, f"{path} (into its embedded architecture)")
    model.to(device).eval()
    return Checkpoint("zoo", model, meta, path, mcfg)


# the robustness area owns its format; imported on first use (core does not import the areas)
CHECKPOINT_KINDS.add("gloro", "modelward.robustness.experiment:load_gloro_checkpoint")
