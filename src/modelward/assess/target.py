"""The model under assessment: its weights, architecture, data and training recipe, loaded once per section.

Sections run as separate runs of the shared runner (possibly in other processes), so each rebuilds the target
from the config with :func:`load_target`; nothing is passed between them in memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from modelward.assess.config import AssessConfig
from modelward.core.checkpoint import Checkpoint, checkpoint_kind, load_checkpoint, read_checkpoint
from modelward.core.data import DataConfig, DataSplit, load_data
from modelward.core.io import load_into
from modelward.core.sources import adapt_state_dict, hf_weight_files
from modelward.core.text import token_embedding
from modelward.core.zoo import ModelConfig, build_model, model_config_from_metadata
from modelward.errors import ConfigError, DataError
from modelward.scan.scanner import load_checked_torch_file


@dataclass
class Target:
    """What every section needs.

    Attributes:
        model: the classifier (logits), in eval mode.
        data: the data it was trained on (``x_train`` are the members, ``x_test`` held out).
        factory: a fresh, untrained model of the same architecture (shadow models, completion originals).
        gloro: the GloRo net when the checkpoint is a ``modelward robust train`` model, else None.
        kind: "gloro", or the model's source: "zoo", "entrypoint", "torchvision", "timm", "hf".
        description: one line for the report.
    """

    model: nn.Module
    data: DataSplit
    factory: Callable[[], nn.Module]
    model_cfg: ModelConfig | None
    gloro: nn.Module | None
    kind: str
    description: str
    # how members (x_train) and non-members (x_test) are known to be exactly what the model was trained and held
    # out on; None: they are not (privacy then refuses rather than score the wrong points)
    membership: str | None = None
    record: dict[str, float] | None = None  # what the checkpoint recorded about itself (final test loss, accuracy)


PICKLE_CHECKPOINTS = (".pt", ".pth", ".bin", ".ckpt")


def _metadata(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    if not path.is_file():
        raise DataError(f"{path}: checkpoint not found (the path tried; a relative checkpoint is read from the "
                        "config file's folder)")
    if path.suffix in PICKLE_CHECKPOINTS:  # a pickle: scanned first, then read by weights_only only if clean

        tensors, _ = load_checked_torch_file(path)
        return tensors, {}
    return read_checkpoint(path)


def _membership(cfg: AssessConfig, data_cfg: DataConfig, meta: dict, data: DataSplit | None = None
                ) -> str | None:
    if data_cfg.test_path:
        return f"members: {data_cfg.path}; non-members: the separate test file {data_cfg.test_path}"
    if data_cfg.train_index:
        return f"members: the rows of {data_cfg.path} listed in {data_cfg.train_index}; non-members: the others"
    if "data" in meta and _same_data(DataConfig.model_validate(meta["data"]), data_cfg):
        return ("the training/test split recorded in the checkpoint's metadata (`modelward train` with this data "
                "config), reproduced exactly")
    if data is not None and data.held_out_given:
        return (f"members: the training set of {data_cfg.entrypoint or data_cfg.path}; non-members: its own "
                "held-out set (as the source split them)")
    return None


_PATH_KEYS = ("path", "labels_path", "test_path", "test_labels_path", "train_index", "tokenizer")


def _same_data(recorded: DataConfig, given: DataConfig) -> bool:
    """The same data config up to where its files are (a recorded relative path vs the resolved absolute one)."""
    a, b = recorded.model_dump(), given.model_dump()
    for k in _PATH_KEYS:
        a[k], b[k] = (None if a[k] is None else Path(a[k]).name), (None if b[k] is None else Path(b[k]).name)
    return a == b


def _code_path(cfg: AssessConfig) -> None:
    """Entry points are imported from the config file's folder (then the usual sys.path)."""
    import sys

    if cfg.code_dir and cfg.code_dir not in sys.path:
        sys.path.insert(0, cfg.code_dir)


def load_target(cfg: AssessConfig) -> Target:
    """Load the model and data an assessment config names (see :class:`~modelward.assess.config.AssessConfig`)."""
    tensors: dict[str, torch.Tensor] = {}
    meta: dict = {}
    if cfg.checkpoint:
        tensors, meta = _metadata(Path(cfg.checkpoint))  # a pickle is scanned first (read_checkpoint otherwise)
        if checkpoint_kind(tensors, meta) == "gloro":  # a `modelward robust train` model
            return _gloro_target(cfg, load_checkpoint(Path(cfg.checkpoint), kinds=("gloro",)))
    data_cfg = cfg.data or (DataConfig.model_validate(meta["data"]) if "data" in meta else DataConfig())
    _code_path(cfg)  # before the data: a data entry point is imported from the config's folder too
    data = load_data(data_cfg)
    model_cfg = cfg.model or (model_config_from_metadata(meta["model"], str(cfg.checkpoint)) if "model" in meta
                              else None)
    if model_cfg is None:
        raise ConfigError(f"{cfg.checkpoint}: its metadata does not say the architecture; add a [model] table "
                          "(as in the config the model was trained with)")

    def factory() -> nn.Module:
        return build_model(model_cfg, data.input_shape, data.num_classes)

    model = factory()
    weights_from = str(cfg.checkpoint)
    if not tensors and model_cfg.resolved_source == "hf" and model_cfg.path:
        tensors, weights_from = _hf_folder_weights(Path(model_cfg.path))
    tensors = adapt_state_dict(model, tensors)
    if tensors:
        load_into(model, tensors, f"{weights_from} ([model] {_model_name(model_cfg, model)} for {data.describe()})")
    model.eval()
    _check_modality(model, data, weights_from)
    data = _named_classes(model, data)
    kind = model_cfg.resolved_source
    n_params = sum(p.numel() for p in model.parameters())
    record = {k: float(meta[k]) for k in ("final_test_loss", "test_accuracy") if isinstance(meta.get(k), int | float)}
    if meta.get("loss") not in (None, "cross_entropy"):
        record.pop("final_test_loss", None)  # only a cross-entropy record compares with what is measured here
    return Target(model, data, factory, model_cfg, None, kind,
                  f"{_model_name(model_cfg, model)} ({n_params:,} parameters) on {data.describe()}",
                  _membership(cfg, data_cfg, meta, data), record)


def _model_name(m: ModelConfig, model: nn.Module) -> str:
    src = m.resolved_source
    if src in ("torchvision", "timm"):
        return f"{src} {m.name}"
    if src == "hf":
        return f"Hugging Face {type(getattr(model, 'hf', model)).__name__}"
    return m.arch


def _named_classes(model: nn.Module, data: DataSplit) -> DataSplit:
    """Class names from a Hugging Face model's ``id2label`` when the data only numbers its classes."""
    id2label = getattr(getattr(getattr(model, "hf", None), "config", None), "id2label", None) or {}
    names = tuple(str(id2label.get(i, "")) for i in range(data.num_classes))
    numbered = data.class_names == tuple(str(i) for i in range(data.num_classes))
    if numbered and all(names) and not all(n == f"LABEL_{i}" for i, n in enumerate(names)):
        return dataclasses.replace(data, class_names=names)
    return data


def _check_modality(model: nn.Module, data: DataSplit, source: str) -> None:
    """Token ids for a model with a token embedding, and only for one: the mismatch named before any section
    (otherwise z-scored ids reach an embedding, or ids reach a convolution, and fail deep inside autograd)."""
    first = next((m for m in model.modules() if any(True for _ in m.parameters(recurse=False))), None)
    if data.is_text:
        try:
            token_embedding(model)
        except ConfigError:
            raise ConfigError(f"{source}: the data are token ids ({data.describe()}) but the model has no "
                              "nn.Embedding to read them") from None
        pad = getattr(model, "pad_token_id", None)
        if pad is not None and pad != data.pad_id:
            raise ConfigError(f"{source}: the model pads with token id {pad} but the data with {data.pad_id} "
                              "(the attention mask would be wrong): give the model's tokenizer as data.tokenizer, or "
                              f"data.pad_id = {pad} for ids given as numbers")
    elif isinstance(first, nn.Embedding):
        raise ConfigError(f"{source}: the model starts with an nn.Embedding (it reads token ids) but the data are "
                          f"{data.modality} values ({data.describe()}): give text as data.text_column with "
                          "data.tokenizer, or token ids as numbers with data.tokens = true (and data.pad_id)")


def _hf_folder_weights(folder: Path) -> tuple[dict[str, torch.Tensor], str]:
    """The weights of a ``save_pretrained`` folder: safetensors files read as they are, a pickled
    ``pytorch_model.bin`` only after the scan found it clean (then with ``weights_only=True``)."""
    files = hf_weight_files(folder)
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        part, _ = _metadata(f)
        tensors.update(part)
    return tensors, (str(files[0]) if len(files) == 1 else f"{folder} ({len(files)} weight files)")


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
    data_cfg = cfg.data or rcfg.data
    membership = _membership(cfg, data_cfg, {"data": rcfg.data.model_dump(mode="json")})
    return Target(model, data, factory, None, net, "gloro",
                  f"GloRo net {rcfg.model.arch!r} ({n_params:,} parameters, trained at ε = {net.epsilon}) on "
                  f"{data.describe()}", membership)


def quality_warning(target: Target, expected_accuracy: float | None = None) -> tuple[float, str | None]:
    """The model's clean test accuracy, and a warning when it is near chance or far below the model's own record
    (a preprocessing or architecture mismatch: every verdict would then describe another model).

    Args:
        target: the loaded target.
        expected_accuracy: the accuracy the owner recorded (``expected_accuracy`` in the config), if any.

    Returns:
        ``(accuracy, warning or None)``. Near chance: at most the majority-class rate + 5 points (or 1/K + 5).
        Far below the record: 10 points under ``expected_accuracy``, or a cross-entropy 1.5× + 0.1 over the
        checkpoint's recorded final test loss.
    """
    d = target.data
    model = target.model
    dev = next((p.device for p in model.parameters()), torch.device("cpu"))
    with torch.no_grad():
        logits = torch.cat([model(d.x_test[i : i + 512].to(dev)).cpu() for i in range(0, len(d.x_test), 512)])
    acc = float((logits.argmax(1) == d.y_test).float().mean())
    loss = float(torch.nn.functional.cross_entropy(logits, d.y_test))
    counts = torch.bincount(d.y_train, minlength=d.num_classes).float()
    chance = max(float(counts.max() / counts.sum()), 1.0 / d.num_classes)
    problems = []
    if acc <= chance + 0.05:
        problems.append(f"clean test accuracy {100 * acc:.1f} % is near chance ({100 * chance:.1f} %, the majority "
                        "class)")
    if expected_accuracy is not None and acc < expected_accuracy - 0.10:
        problems.append(f"clean test accuracy {100 * acc:.1f} % is far below the expected {100 * expected_accuracy:.1f} %")
    rec = target.record or {}
    if "test_accuracy" in rec and acc < rec["test_accuracy"] - 0.10:
        problems.append(f"clean test accuracy {100 * acc:.1f} % is far below the checkpoint's recorded "
                        f"{100 * rec['test_accuracy']:.1f} %")
    if "final_test_loss" in rec and loss > 1.5 * rec["final_test_loss"] + 0.1:
        problems.append(f"test cross-entropy {loss:.3f} is far above the checkpoint's recorded "
                        f"{rec['final_test_loss']:.3f}")
    if not problems:
        return acc, None
    return acc, ("; ".join(problems) + ". The data or preprocessing probably differ from what the model was trained "
                 "on (check [data]: path, standardize, channels, scaling): no verdict is given")
