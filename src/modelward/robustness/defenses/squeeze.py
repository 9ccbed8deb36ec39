"""Feature squeezing as a detector (Xu et al. 2018; seed 004 §2.3.2).

The score of an input is the largest L1 distance between the model's softmax on the input and on each squeezed
version (bit-depth reduction, k×k median filter). The threshold is the (1 − fpr) quantile of the scores of clean
data, so about ``fpr`` of clean inputs are flagged; inputs scoring above it are reported as adversarial.

Defaults suit 8×8 digits: 2-bit depth, no median. On digits a 2×2 median already moves clean predictions as much as
an attack does (strokes are 1–2 pixels wide), so it drowns the signal; enable it (``median=2``) for larger images.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from modelward.core.device import model_device
from modelward.errors import ConfigError
from modelward.robustness.attacks.base import attack_mode


def reduce_bit_depth(x: torch.Tensor, bits: int, clip: tuple[float, float] = (0.0, 1.0)) -> torch.Tensor:
    """Quantise to 2^bits levels over the box."""
    lo, hi = clip
    levels = 2**bits - 1
    return torch.round((x - lo) / (hi - lo) * levels) / levels * (hi - lo) + lo


def median_filter(x: torch.Tensor, k: int) -> torch.Tensor:
    """k×k median over each channel of NCHW images (reflect padding; even k pads right/bottom more, as Xu et al.)."""
    if x.dim() != 4:
        raise ConfigError(f"median filter needs NCHW images, got shape {tuple(x.shape)}")
    n, c, h, w = x.shape
    left, right = (k - 1) // 2, k // 2
    xp = F.pad(x, (left, right, left, right), mode="reflect")
    patches = F.unfold(xp.reshape(n * c, 1, *xp.shape[2:]), k)  # (n*c, k*k, h*w)
    return patches.median(dim=1).values.view(n, c, h, w)


class FeatureSqueezingDetector:
    """``detector.calibrate(x_clean)`` then ``detector.detect(x) -> bool mask`` (True = flagged adversarial).

    Feature squeezing (Xu et al. 2018; seed 004 §2.3): a point is flagged when the model's prediction moves by more
    than a threshold (ℓ1 between probability vectors) under bit-depth reduction or median smoothing; the threshold
    is set on clean data so that a fraction ``fpr`` of it is flagged.

    Args:
        model: the classifier (returns logits).
        bit_depth: bits kept by the bit-depth squeezer (None: off).
        median: window of the median-filter squeezer, images only (None: off).
        fpr: false-positive rate on clean data that :meth:`calibrate` targets.
        clip: the input box.

    Returns:
        The detector; ``calibrate(x_clean)`` sets (and returns) its threshold, ``detect(x)`` returns a bool mask.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> det = FeatureSqueezingDetector(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), bit_depth=2)
        >>> threshold = det.calibrate(torch.rand(100, 1, 8, 8))
        >>> det.detect(torch.rand(5, 1, 8, 8)).shape
        torch.Size([5])
    """

    def __init__(self, model: nn.Module, bit_depth: int | None = 2, median: int | None = None, fpr: float = 0.05,
                 clip: tuple[float, float] = (0.0, 1.0)) -> None:
        if bit_depth is None and median is None:
            raise ConfigError("feature squeezing: enable at least one squeezer (bit_depth or median)")
        if bit_depth is not None and not 1 <= bit_depth <= 16:
            raise ConfigError(f"feature squeezing: bit_depth must be in 1..16, got {bit_depth}")
        if median is not None and median < 2:
            raise ConfigError(f"feature squeezing: median window must be >= 2, got {median}")
        if not 0 < fpr < 1:
            raise ConfigError(f"feature squeezing: fpr must be in (0, 1), got {fpr}")
        self.model, self.bit_depth, self.median, self.fpr, self.clip = model, bit_depth, median, fpr, clip
        self.threshold: float | None = None

    def squeezers(self, x: torch.Tensor) -> list[torch.Tensor]:
        out = []
        if self.bit_depth is not None:
            out.append(reduce_bit_depth(x, self.bit_depth, self.clip))
        if self.median is not None and x.dim() == 4:
            out.append(median_filter(x, self.median))
        return out

    @torch.no_grad()
    def score(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(model_device(self.model))  # scored where the model is
        with attack_mode(self.model):
            p = F.softmax(self.model(x), dim=1)
            dists = [(p - F.softmax(self.model(s), dim=1)).abs().sum(1) for s in self.squeezers(x)]
        return torch.stack(dists).max(0).values

    def calibrate(self, x_clean: torch.Tensor) -> float:
        self.threshold = float(torch.quantile(self.score(x_clean), 1 - self.fpr))
        return self.threshold

    def detect(self, x: torch.Tensor) -> torch.Tensor:
        if self.threshold is None:
            raise ConfigError("feature squeezing: call calibrate(x_clean) before detect()")
        return self.score(x) > self.threshold
