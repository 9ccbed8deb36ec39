"""Non-local-means denoising as an input transform (seed 004 §2.3.1, eq 2.17; Buades et al. 2005).

eq 2.17 averages every location with weights ``f(x_i, x_j)``; as a parameter-free input transform we use the
classical patch-similarity weight ``f = exp(−‖P_i − P_j‖² / h²)`` (mean squared difference of ``patch×patch``
neighbourhoods) over a ``window×window`` search area — eq 2.18's learned embedding needs training inside the
network and is not an input transform. Vectorised: one shifted copy per search offset, patch distances by average
pooling; small windows (3/5) suit 8×8 digits. Differentiable, so white-box attacks can go through it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from modelward.errors import ConfigError


class NonLocalMeans(nn.Module):
    """Non-local-means denoising (Buades et al.) as an input-transformation defense (seed 004 §2.3).

    Args:
        h: filtering strength (larger = smoother).
        patch: side of the compared patches (odd).
        window: side of the search window (odd).

    Returns:
        A module mapping NCHW images to denoised images of the same shape; wrap a classifier with
        :class:`TransformedModel` to defend it (gradients flow through the filter).

    Example:
        >>> import torch
        >>> NonLocalMeans(h=0.2)(torch.rand(2, 1, 8, 8)).shape
        torch.Size([2, 1, 8, 8])
    """

    def __init__(self, h: float = 0.2, patch: int = 3, window: int = 5) -> None:
        super().__init__()
        if h <= 0:
            raise ConfigError(f"nlm: h must be > 0, got {h}")
        if patch < 1 or patch % 2 == 0 or window < 1 or window % 2 == 0:
            raise ConfigError(f"nlm: patch and window must be odd and >= 1, got patch={patch}, window={window}")
        self.h, self.patch, self.window = h, patch, window

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4:
            raise ConfigError(f"nlm: needs NCHW images, got shape {tuple(x.shape)}")
        r, p = self.window // 2, self.patch // 2
        _, _, hgt, wid = x.shape
        pad = r + p
        mode = "reflect" if pad < min(hgt, wid) else "replicate"
        xp = F.pad(x, (pad, pad, pad, pad), mode=mode)
        centre = xp[:, :, r : r + hgt + 2 * p, r : r + wid + 2 * p]
        num = torch.zeros_like(x)
        den = torch.zeros_like(x)
        for dy in range(-r, r + 1):
            for dx in range(-r, r + 1):
                shifted = xp[:, :, r + dy : r + dy + hgt + 2 * p, r + dx : r + dx + wid + 2 * p]
                # patch distance: mean over the patch (and channels) of squared differences
                d = F.avg_pool2d((centre - shifted).pow(2), self.patch, stride=1).mean(1, keepdim=True)
                wgt = torch.exp(-d / self.h**2)
                num = num + wgt * shifted[:, :, p : p + hgt, p : p + wid]
                den = den + wgt
        return num / den


class TransformedModel(nn.Module):
    """``model(transform(x))`` — an input-transform defense as one module, attackable end to end.

    Args:
        transform: the input transformation (e.g. :class:`NonLocalMeans`).
        model: the classifier.

    Returns:
        A module; attacks see the defended pipeline, so gradients flow through the transformation.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> defended = TransformedModel(NonLocalMeans(h=0.2), nn.Sequential(nn.Flatten(), nn.Linear(64, 10)))
        >>> defended(torch.rand(2, 1, 8, 8)).shape
        torch.Size([2, 10])
    """

    def __init__(self, transform: nn.Module, model: nn.Module) -> None:
        super().__init__()
        self.transform, self.model = transform, model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(self.transform(x))
