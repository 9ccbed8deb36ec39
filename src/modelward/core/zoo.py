"""Configurable architectures (seed 000 §4, App. B): MLP, small CNN, AlexNet-style, ResNet-style (bottleneck).

Every model exposes ``part_names``: its natural parts from lower to higher layers, which completion studies and
``modelward parts`` use by default. Models size themselves to the input (8×8 digits up to 224×224 images):
large-input stems (11×11/4 for AlexNet, 7×7/2 + max-pool for ResNet) are used only when the input is ≥ 64 px, and
a max-pool is skipped where the feature map is already 1 px wide. Any user ``nn.Module`` can be used through an
entry point ``package.module:factory``: that is code, run only when the operator trusts it (``--trust-code``,
``MODELWARD_TRUST_CODE=1`` or ``modelward trust allow CONFIG``: :mod:`modelward.core.entrypoints`).
"""

from __future__ import annotations

import inspect
from typing import Any, Literal

import torch
from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator
from torch import nn

from modelward.core.config import StrictModel, validate
from modelward.core.entrypoints import load_entrypoint
from modelward.core.registry import Registry
from modelward.core.sources import SOURCES
from modelward.errors import ConfigError

Arch = Literal["mlp", "cnn", "alexnet", "resnet", "entrypoint"]
#: where the model comes from (core/sources.py): modelward's zoo (``arch``), an entry point, or a model library
ModelSource = Literal["zoo", "entrypoint", "torchvision", "timm", "hf"]
_SOURCE_FIELDS = ("source", "name", "path", "num_classes")


class ModelConfig(StrictModel):
    """Architecture and size. ``width`` multiplies every channel / unit count (AlexNet Small/Std/Large = 0.5/1/1.5).

    ``source`` says where the model comes from (:mod:`modelward.core.sources`): the zoo's ``arch``, an entry
    point, ``torchvision`` / ``timm`` (``name``) or ``hf`` (``path`` to a local folder, or ``kwargs`` with
    ``model_type``); ``num_classes`` sets the logits when the model has more classes than the data shows.
    """

    @model_validator(mode="after")
    def _source_fields(self) -> ModelConfig:
        src = self.resolved_source
        if src in ("torchvision", "timm") and not self.name:
            raise ValueError(f"model.source={src!r} needs model.name (the architecture, e.g. name = \"resnet18\")")
        if src == "hf" and not self.path and "model_type" not in self.kwargs:
            raise ValueError("model.source='hf' needs model.path (a local save_pretrained folder) or model.kwargs "
                             "with model_type (a config built from scratch, e.g. model_type = \"bert\")")
        if src == "entrypoint" and self.arch != "entrypoint":
            raise ValueError("model.source='entrypoint' goes with model.arch='entrypoint' (or leave arch out of it: "
                             "give source = \"entrypoint\" and entrypoint = \"pkg.mod:factory\" with arch = "
                             "\"entrypoint\")")
        if src not in ("torchvision", "timm") and self.name:
            raise ValueError(f"model.name is read for sources torchvision and timm, not {src!r}")
        if src != "hf" and self.path:
            raise ValueError(f"model.path is read for source 'hf' (a local folder), not {src!r}; weights go in "
                             "checkpoint")
        return self

    @model_serializer(mode="wrap")
    def _omit_unset_source(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # the source fields are left out of dumps while unset, so the fingerprints of studies (and the metadata of
        # checkpoints) recorded before they existed still match
        data = handler(self)
        for k in _SOURCE_FIELDS:
            if data.get(k) is None:
                data.pop(k, None)
        return data

    @property
    def resolved_source(self) -> str:
        """``source``, or the one ``arch`` implies ("entrypoint" or "zoo")."""
        if self.source is not None:
            return self.source
        return "entrypoint" if self.arch == "entrypoint" else "zoo"

    arch: Arch = "cnn"
    width: float = Field(1.0, gt=0.0)
    hidden: list[int] = Field(default_factory=lambda: [128, 64])  # mlp hidden units
    channels: list[int] = Field(default_factory=lambda: [16, 32])  # cnn conv channels
    fc: int = Field(64, ge=1)  # cnn hidden FC units
    sections: list[int] = Field(default_factory=lambda: [1, 1, 1, 1])  # resnet blocks per section ([3,4,6,3] = 50)
    base_channels: int = Field(64, ge=1)  # resnet stem / first bottleneck width
    batch_norm: bool = True
    # model sources (core/sources.py): None = "entrypoint" when arch = "entrypoint", else "zoo"
    source: ModelSource | None = None
    name: str | None = None  # torchvision / timm: the architecture's name ("resnet18")
    path: str | None = None  # hf: a local save_pretrained folder (config.json, weights, tokenizer)
    num_classes: int | None = Field(None, ge=2)  # logits of the model (default: the data's classes)
    entrypoint: str | None = None  # "package.module:factory" for arch="entrypoint"
    kwargs: dict[str, Any] = Field(default_factory=dict)  # passed to the entry-point factory
    # the entry point is code: it runs only when the operator trusts it (``code_trusted``, set by the config loader
    # from the operator's trust list, never by the file; or --trust-code: core/entrypoints.py)


def model_config_from_metadata(data: Any, source: str) -> ModelConfig:
    """The ``[model]`` a checkpoint's metadata records, validated, with no trust in code: a file is data, so an
    entry point it names runs only if the operator trusts it (``--trust-code``), whatever the file claims.

    Args:
        data: the metadata's ``model`` entry (a dict, or its JSON text).
        source: the file, quoted in errors.

    Returns:
        The model config, not trusted (``code_trusted`` False; a retired ``trust_code`` key is dropped).

    Example:
        >>> model_config_from_metadata({"arch": "mlp", "trust_code": True}, "m.safetensors").code_trusted
        False
    """
    import json

    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{source}: the model config in its metadata is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the model config in its metadata is not a table")
    data = {k: v for k, v in data.items() if k != "trust_code"}
    return validate(ModelConfig, data, f"{source} (embedded model config)")


def _w(n: int, width: float) -> int:
    return max(1, int(round(n * width)))


class ConvBN(nn.Module):
    """Conv2d (+ BatchNorm) (+ ReLU): one "layer" in the paper's sense, reset as a unit."""

    def __init__(self, cin: int, cout: int, k: int, stride: int = 1, pad: int | None = None, bias: bool = True,
                 bn: bool = True, relu: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride, k // 2 if pad is None else pad, bias=bias)
        self.bn = nn.BatchNorm2d(cout) if bn else nn.Identity()
        self.act = nn.ReLU(inplace=True) if relu else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class MLP(nn.Module):
    def __init__(self, in_features: int, hidden: list[int], num_classes: int) -> None:
        super().__init__()
        dims = [in_features, *hidden]
        self.part_names: list[str] = []
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:], strict=True), start=1):
            self.add_module(f"fc{i}", nn.Linear(a, b))
            self.part_names.append(f"fc{i}")
        self.logits = nn.Linear(dims[-1], num_classes)
        self.part_names.append("logits")
        self.n_hidden = len(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        for i in range(1, self.n_hidden + 1):
            x = torch.relu(getattr(self, f"fc{i}")(x))
        return self.logits(x)


def _pool_if(size: int) -> tuple[nn.Module, int]:
    if size >= 2:
        return nn.MaxPool2d(2), size // 2
    return nn.Identity(), size


class SmallCNN(nn.Module):
    """conv(3×3)+BN+ReLU+pool per entry of ``channels``, then one hidden FC layer and the logits."""

    def __init__(self, in_shape: tuple[int, int, int], channels: list[int], fc: int, num_classes: int,
                 bn: bool = True) -> None:
        super().__init__()
        c, h, _ = in_shape
        self.part_names = []
        self.n_conv = len(channels)
        size = h
        for i, cout in enumerate(channels, start=1):
            pool, size = _pool_if(size)
            self.add_module(f"conv{i}", nn.Sequential(ConvBN(c, cout, 3, bn=bn), pool))
            self.part_names.append(f"conv{i}")
            c = cout
        self.fc1 = nn.Linear(c * size * size, fc)
        self.logits = nn.Linear(fc, num_classes)
        self.part_names += ["fc1", "logits"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(1, self.n_conv + 1):
            x = getattr(self, f"conv{i}")(x)
        return self.logits(torch.relu(self.fc1(x.flatten(1))))


class AlexNetStyle(nn.Module):
    """5 conv (+BN) with max-pooling, global pooling, 2 FC, logits (App. B Table 3: Linear 1 takes 256 inputs).

    Channels 96/256/384/384/256 and FC 4096, scaled by ``width``; logits have no bias, as in Table 3.
    """

    def __init__(self, in_shape: tuple[int, int, int], num_classes: int, width: float = 1.0, bn: bool = True) -> None:
        super().__init__()
        c, h, _ = in_shape
        ch = [_w(n, width) for n in (96, 256, 384, 384, 256)]
        fc = _w(4096, width)
        big = h >= 64
        size = h
        k1, s1 = (11, 4) if big else (3, 1)
        self.conv1 = ConvBN(c, ch[0], k1, s1, pad=2 if big else 1, bn=bn)
        size = (size + 2 * (2 if big else 1) - k1) // s1 + 1
        self.pool1, size = _pool_if(size) if not big else (nn.MaxPool2d(3, 2), (size - 3) // 2 + 1)
        self.conv2 = ConvBN(ch[0], ch[1], 5 if big else 3, bn=bn)
        self.pool2, size = _pool_if(size) if not big else (nn.MaxPool2d(3, 2), (size - 3) // 2 + 1)
        self.conv3 = ConvBN(ch[1], ch[2], 3, bn=bn)
        self.conv4 = ConvBN(ch[2], ch[3], 3, bn=bn)
        self.conv5 = ConvBN(ch[3], ch[4], 3, bn=bn)
        self.pool5, size = _pool_if(size) if not big else (nn.MaxPool2d(3, 2), (size - 3) // 2 + 1)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.linear1 = nn.Linear(ch[4], fc)
        self.linear2 = nn.Linear(fc, fc)
        self.logits = nn.Linear(fc, num_classes, bias=False)
        self.part_names = ["conv1", "conv2", "conv3", "conv4", "conv5", "linear1", "linear2", "logits"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(self.conv1(x))
        x = self.pool2(self.conv2(x))
        x = self.pool5(self.conv5(self.conv4(self.conv3(x))))
        x = self.gap(x).flatten(1)
        x = torch.relu(self.linear1(x))
        x = torch.relu(self.linear2(x))
        return self.logits(x)


class Bottleneck(nn.Module):
    """1×1 → 3×3 → 1×1 (×4) convolutions without bias, BN after each, projection shortcut when shapes change.

    The paper's "-W" part is this block *without* its ``shortcut`` (seed 000 App. B, Table 4).
    """

    expansion = 4

    def __init__(self, cin: int, mid: int, stride: int, bn: bool = True) -> None:
        super().__init__()
        cout = mid * self.expansion
        self.conv1 = nn.Conv2d(cin, mid, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(mid) if bn else nn.Identity()
        self.conv2 = nn.Conv2d(mid, mid, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(mid) if bn else nn.Identity()
        self.conv3 = nn.Conv2d(mid, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout) if bn else nn.Identity()
        self.shortcut: nn.Module
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout) if bn else nn.Identity())
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = torch.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return torch.relu(out + self.shortcut(x))


class ResNetStyle(nn.Module):
    """Stem conv (+ max-pool on large inputs), sections ``layer1..layerK`` of bottleneck blocks, GAP, logits.

    ``sections=[3, 4, 6, 3]``, ``base_channels=64`` on 224×224 gives ResNet50's parameter counts (Table 4).
    """

    def __init__(self, in_shape: tuple[int, int, int], num_classes: int, sections: list[int], base: int = 64,
                 width: float = 1.0, bn: bool = True) -> None:
        super().__init__()
        c, h, _ = in_shape
        base = _w(base, width)
        big = h >= 64
        self.conv1 = ConvBN(c, base, 7 if big else 3, 2 if big else 1, bias=False, bn=bn)
        self.pool = nn.MaxPool2d(3, 2, 1) if big else nn.Identity()
        size = ((h + 1) // 2 + 1) // 2 if big else h
        cin = base
        self.part_names = ["conv1"]
        self.n_sections = len(sections)
        for si, nblocks in enumerate(sections, start=1):
            mid = base * 2 ** (si - 1)
            blocks = []
            for bi in range(nblocks):
                stride = 2 if (si > 1 and bi == 0 and size >= 2) else 1
                if stride == 2:
                    size = (size + 1) // 2
                blocks.append(Bottleneck(cin, mid, stride, bn))
                cin = mid * Bottleneck.expansion
            self.add_module(f"layer{si}", nn.Sequential(*blocks))
            self.part_names.append(f"layer{si}.0")
        self.part_names.append(f"layer{len(sections)}.0-W")
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes, bias=False)
        self.part_names.append("fc")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.conv1(x))
        for si in range(1, self.n_sections + 1):
            x = getattr(self, f"layer{si}")(x)
        return self.fc(self.gap(x).flatten(1))


def _n_features(input_shape: tuple[int, ...]) -> int:
    n = 1
    for d in input_shape:
        n *= d
    return n


def _image(cfg: ModelConfig, input_shape: tuple[int, ...]) -> None:
    if len(input_shape) != 3:
        raise ConfigError(f"model.arch={cfg.arch!r} needs image inputs (C×H×W), got input shape {input_shape}; "
                          "use arch='mlp' for tabular data")


#: ``model.arch`` name -> builder ``(cfg, input_shape, num_classes) -> nn.Module``
ARCHITECTURES = Registry("model.arch")


@ARCHITECTURES.register("mlp")
def _build_mlp(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return MLP(_n_features(input_shape), [_w(h, cfg.width) for h in cfg.hidden], num_classes)


@ARCHITECTURES.register("cnn")
def _build_cnn(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    _image(cfg, input_shape)
    return SmallCNN(input_shape, [_w(c, cfg.width) for c in cfg.channels], _w(cfg.fc, cfg.width), num_classes,
                    cfg.batch_norm)


@ARCHITECTURES.register("alexnet")
def _build_alexnet(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    _image(cfg, input_shape)
    return AlexNetStyle(input_shape, num_classes, cfg.width, cfg.batch_norm)


@ARCHITECTURES.register("resnet")
def _build_resnet(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    _image(cfg, input_shape)
    if not cfg.sections or min(cfg.sections) < 1:
        raise ConfigError("model.sections: need at least one section with >= 1 block, e.g. [1, 1, 1, 1]")
    return ResNetStyle(input_shape, num_classes, cfg.sections, cfg.base_channels, cfg.width, cfg.batch_norm)


@ARCHITECTURES.register("entrypoint")
def _build_entrypoint(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if not cfg.entrypoint:
        raise ConfigError("model.entrypoint: required when model.arch='entrypoint' (e.g. 'mypkg.nets:build')")
    # (the [model] table may sit elsewhere, e.g. [model.net] in a guard config: the message says "the same table")
    factory = load_entrypoint(cfg.entrypoint, field="model entrypoint", trusted=cfg.code_trusted,
                              source=cfg.config_source)
    kwargs = dict(cfg.kwargs)
    params = inspect.signature(factory).parameters
    if "input_shape" in params:
        kwargs.setdefault("input_shape", tuple(input_shape))
    if "num_classes" in params:
        kwargs.setdefault("num_classes", num_classes)
    model = factory(**kwargs)
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model.entrypoint {cfg.entrypoint!r} returned {type(model).__name__}, not an nn.Module")
    return model


def build_model(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Build the configured architecture for inputs of `input_shape` (without batch dim) and `num_classes`.

    Args:
        cfg: the ``[model]`` table (``source`` one of ``SOURCES.names()``; for the zoo, ``arch`` one of
            ``ARCHITECTURES.names()``).
        input_shape: one input's shape without the batch dimension (C×H×W images, or (features,)).
        num_classes: number of output logits.

    Returns:
        The untrained model (its ``part_names`` list its natural parts, lower to higher layers).

    Example:
        >>> net = build_model(ModelConfig(arch="mlp", hidden=[16]), (64,), 10)
        >>> net(torch.zeros(2, 64)).shape
        torch.Size([2, 10])
    """
    n = cfg.num_classes or num_classes
    if n < num_classes:
        raise ConfigError(f"model.num_classes = {cfg.num_classes}, but the data has {num_classes} classes")
    return SOURCES.get(cfg.resolved_source)(cfg, input_shape, n)


@SOURCES.register("zoo")
def _build_zoo(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if cfg.arch == "entrypoint":
        raise ConfigError("model.source='zoo' builds arch mlp, cnn, alexnet or resnet; arch='entrypoint' goes with "
                          "source='entrypoint'")
    return ARCHITECTURES.get(cfg.arch)(cfg, input_shape, num_classes)


SOURCES.register("entrypoint")(_build_entrypoint)
