"""Image similarity shared by the areas that score reconstructions (privacy's overt-encoding analysis, the
governance input-leakage audit).

:func:`ssim` is the structural similarity index of Wang et al. (2004, "Image quality assessment: from error
visibility to structural similarity", IEEE TIP, Eq. 13) with a Gaussian window, averaged over the valid region.

Example:
    >>> import torch
    >>> a = torch.rand(2, 1, 8, 8)
    >>> ssim(a, a, data_range=1.0).tolist()
    [1.0, 1.0]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _gauss_window(size: int, sigma: float) -> torch.Tensor:
    ax = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-(ax ** 2) / (2 * sigma ** 2))
    g = g / g.sum()
    return (g[:, None] * g[None, :])[None, None]


def ssim(a: torch.Tensor, b: torch.Tensor, data_range: float | None = None, window: int = 7,
         sigma: float = 1.5) -> torch.Tensor:
    """Structural similarity (Wang et al. 2004) of image pairs (N×C×H×W or N×H×W), Gaussian window, mean over
    the valid region.

    Args:
        a, b: the two image batches, same shape.
        data_range: the images' value range (1.0 for images in [0, 1]); default: the joint range of each pair.
        window: the Gaussian window's side (at most the image side); sigma: its standard deviation.

    Returns:
        ``(N,)`` float64, 1.0 for identical images.
    """
    if a.dim() == 3:
        a, b = a[:, None], b[:, None]
    a, b = a.double(), b.double()
    n, c, h, w = a.shape
    k = min(window, h, w)
    win = _gauss_window(k, sigma).to(a.device).expand(c, 1, k, k)
    if data_range is None:
        lo = torch.minimum(a.flatten(1).min(1).values, b.flatten(1).min(1).values)
        hi = torch.maximum(a.flatten(1).max(1).values, b.flatten(1).max(1).values)
        L = (hi - lo).clamp_min(1e-12).view(n, 1, 1, 1)
    else:
        L = torch.full((n, 1, 1, 1), float(data_range), dtype=torch.float64, device=a.device)
    c1, c2 = (0.01 * L) ** 2, (0.03 * L) ** 2

    def f(t: torch.Tensor) -> torch.Tensor:
        return F.conv2d(t, win, groups=c)

    mu_a, mu_b = f(a), f(b)
    saa = f(a * a) - mu_a ** 2
    sbb = f(b * b) - mu_b ** 2
    sab = f(a * b) - mu_a * mu_b
    s = ((2 * mu_a * mu_b + c1) * (2 * sab + c2)) / ((mu_a ** 2 + mu_b ** 2 + c1) * (saa + sbb + c2))
    return s.flatten(1).mean(1)
