"""Where a model comes from: one registry mapping ``[model] source`` to a builder (next_step §5).

``source`` is one of

- ``"zoo"`` (default): modelward's own architectures, ``arch = "mlp" | "cnn" | "alexnet" | "resnet"``
  (:mod:`modelward.core.zoo`);
- ``"entrypoint"``: a factory of yours, ``entrypoint = "pkg.mod:factory"`` (code: it runs only when the operator
  trusts it, :mod:`modelward.core.entrypoints`);
- ``"torchvision"``: ``name = "resnet18"`` (any classification model of ``torchvision.models``);
- ``"timm"``: ``name = "resnet18"`` (any ``timm.create_model`` name);
- ``"hf"``: a Hugging Face ``transformers`` sequence classifier: ``path`` = a local folder written by
  ``save_pretrained`` (``config.json``, weights, tokenizer), or a config given inline as ``kwargs`` (``model_type =
  "bert"`` and its sizes) for a model built from scratch.

Every builder returns an ``nn.Module`` that maps a batch of inputs to logits, as every area expects: an HF model is
wrapped by :class:`HFSequenceClassifier`, which takes token ids (``int64``, ``N × L``, right-padded with the
config's ``pad_token_id``) and derives the attention mask from them. Builders build the *architecture* (random
weights): the weights come from the assessed checkpoint (``.safetensors``, or a pickled ``.pt``/``.pth``/``.bin``
that is scanned before anything is read), or from the HF folder's own weight files (:func:`hf_weight_files`).

Nothing is downloaded: torchvision and timm are never asked for pretrained weights (a ``weights``/``pretrained``
keyword is refused), transformers is imported with ``HF_HUB_OFFLINE=1`` and reads local files only, and a config
that needs the model's own Python code (``auto_map``) is refused, never run (``trust_remote_code`` stays False).

Where a library cannot be had, the builder raises one line saying which extra installs it (README, "Models from
torchvision, timm and Hugging Face").
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from modelward.core.registry import Registry
from modelward.errors import ConfigError, DataError

#: ``model.source`` name -> builder ``(cfg, input_shape, num_classes) -> nn.Module`` (cfg: a ModelConfig)
SOURCES = Registry("model.source")

# the two operators torchvision registers fake (meta) kernels for whether or not its C++ library loaded
# (torchvision/_meta_registrations.py, 0.28 and 0.29): defining their schemas lets `import torchvision` finish when
# that library cannot load (see import_torchvision)
_TORCHVISION_SCHEMAS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
                        "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_TORCHVISION_LIB: Any = None  # keeps the schema library alive for the life of the process
VISION_HINT = ("install the vision extra beside the CPU torch: `make vision` (a venv .venv-vision), or pip install "
               "torch==2.13.0 then pip install -e '.[vision]' (README: models from torchvision, timm and Hugging "
               "Face)")
TEXT_HINT = "install the text extra: pip install -e '.[text]' (transformers, tokenizers, datasets)"


def _not_installed(lib: str, hint: str) -> ConfigError:
    return ConfigError(f"model.source needs {lib}, which is not installed here: {hint}")


def import_torchvision() -> Any:
    """``import torchvision``, also where its C++ operators cannot load beside this torch.

    PyPI's torchvision wheels for Linux are linked against the CUDA build of torch (``libtorch_cuda.so``). Beside
    the CPU build of the same torch release their C++ library (``torchvision/_C.so``: nms, roi_align, deform_conv,
    ...) fails to load; torchvision tolerates that (its ops then raise "Couldn't load custom C++ ops" when called),
    but its ``_meta_registrations`` module registers fake kernels for ``torchvision::nms`` and ``torchvision::qnms``
    unconditionally, which raises ``operator torchvision::nms does not exist`` and aborts the import.

    Only in that exact case this function defines those two operators' schemas (no kernel) and imports again. The
    classification models (``torchvision.models``) are Python modules over torch's own operators and do not use
    them; detection operators still raise torchvision's own error when called. A torchvision whose C++ library
    loads (a CPU build from PyTorch's index, or a CUDA torch) is imported untouched.

    Returns:
        The ``torchvision`` module.

    Raises:
        ConfigError: torchvision is not installed, or fails to import for another reason (one line, with the fix).

    Example:
        >>> tv = import_torchvision()  # doctest: +SKIP
        >>> tv.models.resnet18(num_classes=3)(torch.zeros(1, 3, 32, 32)).shape  # doctest: +SKIP
        torch.Size([1, 3])
    """
    global _TORCHVISION_LIB
    try:
        import torchvision

        return torchvision
    except ImportError:
        raise _not_installed("torchvision", VISION_HINT) from None
    except RuntimeError as e:
        if "torchvision::nms does not exist" not in str(e):
            raise ConfigError(f"torchvision is installed but does not import beside torch {torch.__version__} "
                              f"({str(e).splitlines()[-1]}); {VISION_HINT}") from None
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]  # the failed import's half-initialised modules
    if _TORCHVISION_LIB is None:
        lib = torch.library.Library("torchvision", "DEF")  # noqa: TOR901 - schema only: no kernel is registered
        for schema in _TORCHVISION_SCHEMAS:
            lib.define(schema)
        _TORCHVISION_LIB = lib
    try:
        import torchvision
    except Exception as e:  # noqa: BLE001 - any other failure gets the one-line hint
        raise ConfigError(f"torchvision does not import beside torch {torch.__version__} ({type(e).__name__}: "
                          f"{str(e).splitlines()[-1] if str(e) else ''}); {VISION_HINT}") from None
    return torchvision


def import_timm() -> Any:
    """``import timm`` (timm imports torchvision at import time: through :func:`import_torchvision`)."""
    import_torchvision()
    try:
        import timm
    except ImportError:
        raise _not_installed("timm", VISION_HINT) from None
    return timm


def import_transformers() -> Any:
    """``import transformers`` with the hub offline (modelward reads local files only; a download attempt fails)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # documented: modelward never downloads
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import transformers
    except ImportError:
        raise _not_installed("transformers", TEXT_HINT) from None
    transformers.logging.set_verbosity_error()  # "some weights were newly initialised": expected for from_config
    return transformers


# ------------------------------------------------------------------------------------------------ builders
_DOWNLOAD_KWARGS = {"weights", "pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "checkpoint_path",
                    "weights_backbone", "progress"}


def _no_downloads(cfg: Any) -> dict[str, Any]:
    bad = sorted(set(cfg.kwargs) & _DOWNLOAD_KWARGS)
    if bad:
        raise ConfigError(f"model.kwargs {bad}: modelward never downloads or loads weights through the model "
                          "library; build the architecture and give your weights as checkpoint = "
                          "\"model.safetensors\" (or a .pth state dict, scanned before it is read)")
    return dict(cfg.kwargs)


def _image_channels(source: str, input_shape: tuple[int, ...]) -> int:
    if len(input_shape) != 3:
        raise ConfigError(f"model.source={source!r} builds image classifiers (inputs C×H×W), but the data's inputs "
                          f"have shape {input_shape}")
    return int(input_shape[0])


def _part_names(model: nn.Module) -> list[str]:
    """The top-level children holding parameters, lower to higher layers (what `modelward parts` lists)."""
    return [n for n, m in model.named_children() if any(True for _ in m.parameters())]


@SOURCES.register("torchvision")
def build_torchvision(cfg: Any, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """``torchvision.models.get_model(name, weights=None, num_classes=...)``, random weights."""
    tv = import_torchvision()
    channels = _image_channels("torchvision", input_shape)
    names = tv.models.list_models(module=tv.models)  # classification models only
    if cfg.name not in names:
        raise ConfigError(f"model.name {cfg.name!r} is not a torchvision classification model; valid choices: "
                          f"{names}")
    if channels != 3:
        raise ConfigError(f"model.source='torchvision' models take 3-channel images, the data has {channels} "
                          "(set data.channels = 3 for an image folder)")
    model = tv.models.get_model(cfg.name, weights=None, num_classes=num_classes, **_no_downloads(cfg))
    model.part_names = _part_names(model)
    return model


@SOURCES.register("timm")
def build_timm(cfg: Any, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """``timm.create_model(name, pretrained=False, num_classes=..., in_chans=...)``, random weights."""
    timm = import_timm()
    channels = _image_channels("timm", input_shape)
    if not timm.is_model(cfg.name):
        close = timm.list_models(f"*{cfg.name}*")[:20]
        raise ConfigError(f"model.name {cfg.name!r} is not a timm model; e.g. {close or timm.list_models()[:20]} "
                          "(timm.list_models() lists all)")
    kwargs = _no_downloads(cfg)
    kwargs.setdefault("in_chans", channels)
    model = timm.create_model(cfg.name, pretrained=False, num_classes=num_classes, **kwargs)
    model.part_names = _part_names(model)
    return model


class HFSequenceClassifier(nn.Module):
    """A ``transformers`` sequence classifier as a module from token ids to logits.

    Inputs are token ids (``int64``, ``N × L``) right-padded with ``pad_token_id``; the attention mask is
    ``ids != pad_token_id`` (so the mask travels with the ids wherever the model is called: attacks, shadow
    models, the guarded API). The wrapped model is ``self.hf``; its state dict keys are the HF names prefixed
    with ``hf.`` (:func:`adapt_state_dict` accepts a file saved by ``save_pretrained`` as it is).

    Args:
        hf_model: an ``AutoModelForSequenceClassification`` model.
        pad_token_id: the padding token's id (the config's, else 0).

    Example:
        >>> net = build_model(ModelConfig(source="hf", kwargs={"model_type": "bert", ...}), (16,), 2)  # doctest: +SKIP
        >>> net(torch.tensor([[1, 5, 7, 2, 0, 0]])).shape  # doctest: +SKIP
        torch.Size([1, 2])
    """

    weights_prefix = "hf."

    def __init__(self, hf_model: nn.Module, pad_token_id: int) -> None:
        super().__init__()
        self.hf = hf_model
        self.pad_token_id = int(pad_token_id)
        base = getattr(hf_model, hf_model.base_model_prefix, None) if hasattr(hf_model, "base_model_prefix") else None
        self.part_names = ([f"hf.{hf_model.base_model_prefix}.{n}" for n in _part_names(base)] if base is not None
                           else []) + [f"hf.{n}" for n, m in hf_model.named_children() if m is not base
                                       and any(True for _ in m.parameters())]

    def token_embedding(self) -> nn.Embedding:
        """The token embedding table (inputs of embedding-space attacks and attributions)."""
        emb = self.hf.get_input_embeddings()
        assert isinstance(emb, nn.Embedding)
        return emb

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if input_ids.is_floating_point():
            raise DataError(f"the text model takes token ids (int64), got {input_ids.dtype} inputs: the data are "
                            "not token ids (give text through data.text_column and data.tokenizer, or token ids "
                            "with data.tokens = true)")
        mask = (input_ids != self.pad_token_id).long()
        return self.hf(input_ids=input_ids, attention_mask=mask).logits


def _hf_config(cfg: Any, num_classes: int) -> Any:
    tr = import_transformers()
    if cfg.path:
        folder = Path(cfg.path)
        if not (folder / "config.json").is_file():
            raise DataError(f"{folder}: model.path for source 'hf' must be a folder with a config.json (what "
                            "save_pretrained writes); the path tried is shown here")
        try:
            raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise DataError(f"{folder / 'config.json'}: not valid JSON ({e})") from None
        if "auto_map" in raw:
            raise ConfigError(f"{folder / 'config.json'}: the model needs its own Python code (auto_map "
                              f"{sorted(raw['auto_map'])}); modelward never runs a model folder's code "
                              "(trust_remote_code stays off): build it through an entry point you trust "
                              "(source = \"entrypoint\")")
        hf_cfg = tr.AutoConfig.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False,
                                               **cfg.kwargs)
    else:
        kw = dict(cfg.kwargs)
        model_type = kw.pop("model_type", None)
        if not model_type:
            raise ConfigError("model.source='hf' needs model.path (a local save_pretrained folder) or model.kwargs "
                              "with model_type (e.g. kwargs = {model_type = \"bert\", vocab_size = 1000, "
                              "hidden_size = 64, num_hidden_layers = 2, num_attention_heads = 2})")
        try:
            hf_cfg = tr.AutoConfig.for_model(model_type, **kw)
        except ValueError as e:
            raise ConfigError(f"model.kwargs.model_type {model_type!r}: {str(e).splitlines()[0]}") from None
    labels = getattr(hf_cfg, "num_labels", None)
    if cfg.path and labels not in (None, 2, num_classes):  # 2 is transformers' default when a config says nothing
        raise ConfigError(f"{cfg.path}: the model has {labels} labels but the data has {num_classes} classes; set "
                          f"model.num_classes = {labels} if the data holds only some of the model's classes")
    hf_cfg.num_labels = num_classes
    return hf_cfg


@SOURCES.register("hf")
def build_hf(cfg: Any, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """``AutoModelForSequenceClassification.from_config(config)`` wrapped as :class:`HFSequenceClassifier`."""
    tr = import_transformers()
    if len(input_shape) != 1:
        raise ConfigError(f"model.source='hf' builds text classifiers over token ids (inputs of shape (L,)), but "
                          f"the data's inputs have shape {input_shape}")
    hf_cfg = _hf_config(cfg, num_classes)
    try:
        model = tr.AutoModelForSequenceClassification.from_config(hf_cfg, trust_remote_code=False)
    except ValueError as e:
        raise ConfigError(f"model.source='hf': {type(hf_cfg).__name__} has no sequence-classification model "
                          f"({str(e).splitlines()[0]})") from None
    pad = getattr(hf_cfg, "pad_token_id", None)
    return HFSequenceClassifier(model, 0 if pad is None else int(pad))


# ------------------------------------------------------------------------------------------------ weights
def hf_weight_files(folder: str | Path) -> list[Path]:
    """The weight files of a ``save_pretrained`` folder, safetensors first: ``model.safetensors``, the shards its
    ``model.safetensors.index.json`` lists, else a pickled ``pytorch_model.bin`` (or its shards) — which the caller
    must scan before reading. Empty when the folder has no weights (a config only).

    Example:
        >>> hf_weight_files("no-such-folder")
        []
    """
    folder = Path(folder)
    for single, index in (("model.safetensors", "model.safetensors.index.json"),
                          ("pytorch_model.bin", "pytorch_model.bin.index.json")):
        if (folder / single).is_file():
            return [folder / single]
        if (folder / index).is_file():
            try:
                shards = sorted(set(json.loads((folder / index).read_text())["weight_map"].values()))
            except (ValueError, KeyError, TypeError) as e:
                raise DataError(f"{folder / index}: not a valid shard index ({e})") from None
            bad = [s for s in shards if Path(s).name != s]
            if bad:
                raise DataError(f"{folder / index}: shard names must be files of the folder, got {bad[:3]}")
            return [folder / s for s in shards]
    return []


def adapt_state_dict(model: nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Weights saved by the model's own library for a wrapped model (``save_pretrained`` names, no ``hf.``
    prefix) renamed to the wrapper's state dict; other weights unchanged.

    Example:
        >>> adapt_state_dict(nn.Linear(1, 1), {"weight": torch.ones(1, 1)}).keys()
        dict_keys(['weight'])
    """
    prefix = getattr(model, "weights_prefix", "")
    if not prefix or not tensors or any(k.startswith(prefix) for k in tensors):
        return tensors
    return {prefix + k: v for k, v in tensors.items()}
