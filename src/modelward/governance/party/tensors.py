"""Tensor helpers of a party's hot path: the memory layout its kernels want, and a one-pass magnitude bound.

Example:
    >>> import torch
    >>> max_abs(torch.tensor([-3.0, 2.0]))
    3.0
    >>> layout(torch.zeros(2, 3, 4, 4)).is_contiguous(memory_format=torch.channels_last)
    True
"""

from __future__ import annotations

import math

import torch


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
