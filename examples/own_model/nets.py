"""Your own architectures, as `modelward assess` imports them (``[model] arch = "entrypoint"``): a factory taking
the input shape and the number of classes (both optional) and returning an ``nn.Module`` that outputs logits.

An entry point is code: `modelward assess` imports it from the config file's folder, so only point a config at a
factory you trust.
"""

from __future__ import annotations

from torch import nn


def mlp(input_shape: tuple[int, ...], num_classes: int, hidden: int = 32) -> nn.Module:
    """A two-layer perceptron for tabular rows (e.g. a CSV)."""
    n = 1
    for d in input_shape:
        n *= d
    return nn.Sequential(nn.Flatten(), nn.Linear(n, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))


def small_cnn(input_shape: tuple[int, ...], num_classes: int, width: int = 8) -> nn.Module:
    """A small CNN for 1- or 3-channel images (C×H×W), e.g. a ResNet-like model's little sibling."""
    c = input_shape[0]
    return nn.Sequential(
        nn.Conv2d(c, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
        nn.Linear(8 * width, 32), nn.ReLU(), nn.Linear(32, num_classes))
