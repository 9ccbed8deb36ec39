"""Figures of the privacy reports: ROC curves on log-scale FPR (as the field plots them) and image grids."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402


def roc_plot(path: str | Path, curves: dict[str, tuple[np.ndarray, np.ndarray]], title: str) -> Path:
    """One ROC per attack with log-log axes (FPR from 1e-4 or 1/N), plus the chance diagonal."""
    path = Path(path)
    fig, ax = plt.subplots(figsize=(5.5, 5.0))
    lo = 1.0
    for label, (fpr, tpr) in curves.items():
        pos = fpr[fpr > 0]
        lo = min(lo, pos.min() if len(pos) else 1.0)
        ax.plot(np.maximum(fpr, 1e-5), np.maximum(tpr, 1e-5), label=label, linewidth=1.2)
    lo = max(min(lo, 1e-2), 1e-4)
    ax.plot([lo, 1], [lo, 1], "k--", linewidth=0.8, label="chance")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, 1)
    ax.set_ylim(lo, 1)
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def image_grid(path: str | Path, images: torch.Tensor | np.ndarray, titles: Sequence[str] | None = None,
               ncol: int = 8, title: str | None = None) -> Path:
    """Save N×C×H×W (or N×H×W, or N×D with square D) images as a grid; each image min-max scaled on its own."""
    path = Path(path)
    x = images.detach().cpu().numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
    if x.ndim == 2:
        side = int(round(np.sqrt(x.shape[1])))
        if side * side != x.shape[1]:
            raise ValueError(f"cannot show vectors of length {x.shape[1]} as square images")
        x = x.reshape(len(x), side, side)
    if x.ndim == 4:
        x = x.transpose(0, 2, 3, 1)
        if x.shape[-1] == 1:
            x = x[..., 0]
    n = max(1, len(x))
    ncol = max(1, min(ncol, n))
    nrow = (n + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(1.3 * ncol, 1.4 * nrow + (0.4 if title else 0)), squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i >= len(x):
            continue
        im = x[i].astype(np.float64)
        im = (im - im.min()) / (im.max() - im.min() + 1e-12)
        ax.imshow(im, cmap="gray" if im.ndim == 2 else None, interpolation="nearest")
        if titles is not None and i < len(titles):
            ax.set_title(str(titles[i]), fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
