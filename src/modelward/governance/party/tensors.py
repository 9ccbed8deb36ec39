"""Tensor helpers of a party's hot path: the memory layout its kernels want, a one-pass magnitude bound, and the
``[compression]`` table that says how the party's tensors leave it (opt-in 8-bit or top-k compression of the
activations it sends forward and the gradients it returns; the codecs are in :mod:`modelward.governance.wire`).

Example:
    >>> import torch
    >>> max_abs(torch.tensor([-3.0, 2.0]))
    3.0
    >>> layout(torch.zeros(2, 3, 4, 4)).is_contiguous(memory_format=torch.channels_last)
    True
"""

from __future__ import annotations

import hashlib
import math
from typing import Literal

import torch
from pydantic import Field

from modelward.core.config import StrictModel
from modelward.errors import ConfigError
from modelward.governance.wire import Codec


def layout(x: torch.Tensor) -> torch.Tensor:
    """An input in the layout the CPU convolution kernels are fastest with: channels-last for image batches, as
    is for anything else. Values are unchanged; only the memory order differs. `x` must be the party's own
    tensor (decoded from a message, or indexed from its data): one already in that layout is used as it is,
    anything else is copied."""
    if x.dim() == 4 and x.is_floating_point():
        if format_of(x) is torch.channels_last:  # strides exactly channels-last (what the kernels look at)
            return x
        return x.clone(memory_format=torch.channels_last)
    return x


def format_of(t: torch.Tensor) -> torch.memory_format:
    """``torch.channels_last`` for a 4-d tensor whose strides are exactly channels-last, else contiguous."""
    if t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def max_abs(t: torch.Tensor) -> float:
    """max |t| (NaN if any element is NaN, inf if any is infinite) in one pass, without a temporary |t|."""
    if t.numel() == 0:
        return 0.0
    t = t.detach()
    if t.dim() == 4 and format_of(t) is torch.channels_last:
        # the same elements in memory order (a view): a reduction over a channels-last tensor is several times
        # slower than over contiguous memory (figures: docs/benchmarks/governance.md)
        t = t.permute(0, 2, 3, 1).reshape(-1)
    lo, hi = torch.aminmax(t)  # both NaN if any element is
    lo, hi = float(lo), float(hi)
    return float("nan") if math.isnan(hi) or math.isnan(lo) else max(-lo, hi)


class TensorCompression(StrictModel):
    """How one kind of tensor leaves the party (a :class:`~modelward.governance.wire.Codec`).

    Args:
        method: ``"none"`` (default: exact float32, bit-identical to a party without this table), ``"int8"``
            (absmax 8-bit, Dettmers 2016; ≈ 4× fewer bytes, error at most half a quantization step) or ``"topk"``
            (the ``ratio`` share of largest-magnitude entries per row, Aji & Heafield 2017 / Lin et al. 2018
            Deep Gradient Compression; ≈ ``ratio`` × 1.5 of the bytes with int16 indices).
        scale: int8: ``"row"`` (one scale per example) or ``"tensor"``.
        stochastic: int8: unbiased stochastic rounding (QSGD, Alistarh et al. 2017).
        ratio: topk: the fraction of each row kept, in (0, 1].
        seed: stochastic rounding only, for reproducible experiments: the rounding key is derived from it (leave
            unset: a random key per process).

    Returns:
        A strict config; :meth:`codec` gives the wire :class:`~modelward.governance.wire.Codec` (None for none).

    Example:
        >>> TensorCompression(method="topk", ratio=0.01).codec().describe([32, 1024])
        'topk(k=11 of 1024)'
        >>> TensorCompression().codec() is None
        True
    """

    method: Literal["none", "int8", "topk"] = "none"
    scale: Literal["row", "tensor"] = "row"
    stochastic: bool = False
    ratio: float = Field(0.1, gt=0.0, le=1.0)
    seed: int | None = None

    def codec(self) -> Codec | None:
        """The wire codec (None for ``method = "none"``: tensors travel exactly as without compression)."""
        if self.method == "none":
            return None
        key = None if self.seed is None else hashlib.sha256(f"modelward-rounding:{self.seed}".encode()).digest()
        return Codec(self.method, scale=self.scale, stochastic=self.stochastic, ratio=self.ratio, key=key)


class CompressionConfig(StrictModel):
    """``[compression]``: what this party sends compressed. ``activations``: the activation ``h`` it sends to the
    next party (training, evaluation and prediction passes); ``gradients``: the gradient ``g`` it returns to the
    previous party (after the label holder's protection). The receiver needs no setting: the codec travels in
    the message's spec and is checked there. Default: nothing compressed.

    Args:
        activations: how the activation this party sends forward travels (:class:`TensorCompression`).
        gradients: how the gradient it returns travels.

    Returns:
        A strict config (``PartyConfig.compression``, ``LeakageAuditConfig.compression``).

    Example:
        >>> CompressionConfig.model_validate({"gradients": {"method": "int8"}}).gradients.method
        'int8'
    """

    activations: TensorCompression = Field(default_factory=TensorCompression)
    gradients: TensorCompression = Field(default_factory=TensorCompression)


def send_codecs(compression: CompressionConfig, who: str, is_first: bool, is_last: bool) -> dict[str, Codec]:
    """The codecs of the tensors a party sends (``[compression]``): ``h`` to the next party, ``g`` back to the
    previous one. A setting for a tensor the party never sends is refused at start-up (ConfigError).

    Args:
        compression: the party's ``[compression]`` table.
        who: the party's name, for errors.
        is_first: the party holds the inputs (it returns no gradient).
        is_last: the party holds the labels (it sends no activation on).

    Returns:
        ``{"h": codec, "g": codec}``, only the tensors sent compressed.

    Example:
        >>> send_codecs(CompressionConfig(), "alice", is_first=True, is_last=False)
        {}
    """
    out: dict[str, Codec] = {}
    for key, kind, sends in (("h", "activations", not is_last), ("g", "gradients", not is_first)):
        codec = getattr(compression, kind).codec()
        if codec is None:
            continue
        if not sends:
            raise ConfigError(f"party {who}: [compression] {kind} = {getattr(compression, kind).method!r}, but "
                              f"this party sends no {kind} (it holds the {'labels' if is_last else 'inputs'});"
                              " remove it or set method = \"none\"")
        out[key] = codec
    return out
