"""Image grids for explanations: inputs next to their attribution maps (diverging colours, 0 = white)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402


def _to_hw(t: torch.Tensor) -> np.ndarray:
    """C×H×W → H×W (channels summed; the sign of an attribution is kept), for 1-, 3- or any-channel maps."""
    a = t.detach().double().cpu().numpy()
    if a.ndim == 3:
        a = a.sum(0)  # an RGB map drawn as C×H×W is not an image matplotlib can show
    elif a.ndim == 1:
        side = int(round(np.sqrt(a.size)))
        a = a.reshape(side, side) if side * side == a.size else a[None]
    return a


def _image(t: torch.Tensor) -> np.ndarray:
    a = t.detach().double().cpu().numpy()
    if a.ndim == 3 and a.shape[0] == 3:
        a = np.transpose(a, (1, 2, 0))
        lo, hi = a.min(), a.max()
        return (a - lo) / (hi - lo + 1e-12)
    return _to_hw(t)


def attribution_grid(path: str | Path, images: torch.Tensor, maps: dict[str, torch.Tensor],
                     col_titles: Sequence[str] | None = None, title: str = "") -> Path:
    """One column per input; first row the input, then one row per map (e.g. per method or per model).
    Each map is drawn with a symmetric diverging scale (red = raises the quantity, blue = lowers it)."""
    path = Path(path)
    n = len(images)
    rows = 1 + len(maps)
    fig, axes = plt.subplots(rows, n, figsize=(1.3 * n + 1.2, 1.3 * rows + 0.4), squeeze=False)
    for j in range(n):
        ax = axes[0, j]
        img = _image(images[j])
        ax.imshow(img, cmap="gray" if img.ndim == 2 else None)
        if col_titles is not None:
            ax.set_title(str(col_titles[j]), fontsize=7)
        for i, (_, m) in enumerate(maps.items(), start=1):
            a = _to_hw(m[j])
            lim = float(np.abs(a).max()) or 1.0
            axes[i, j].imshow(a, cmap="bwr", vmin=-lim, vmax=lim)
    for i, name in enumerate(["input", *maps], start=0):
        axes[i, 0].set_ylabel(name, fontsize=7, rotation=0, ha="right", va="center")
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def unit_grid(path: str | Path, panels: list[list[tuple]], row_titles: Sequence[str],
              title: str = "", signed: bool = True) -> Path:
    """Rows of small images with captions (e.g. per class: the example, then the top units' input attributions or
    inversions). A panel is ``(tensor, caption)`` or ``(tensor, caption, signed)`` to override ``signed``."""
    path = Path(path)
    rows = len(panels)
    cols = max((len(r) for r in panels), default=1)
    fig, axes = plt.subplots(rows, cols, figsize=(1.4 * cols + 1.2, 1.4 * rows + 0.4), squeeze=False)
    for i, row in enumerate(panels):
        for j in range(cols):
            ax = axes[i, j]
            ax.set_xticks([])
            ax.set_yticks([])
            if j >= len(row):
                ax.axis("off")
                continue
            t, caption, *kind = row[j]
            signed_here = signed if not kind else bool(kind[0])
            a = _to_hw(t) if signed_here else _image(t)
            if signed_here:
                lim = float(np.abs(a).max()) or 1.0
                ax.imshow(a, cmap="bwr", vmin=-lim, vmax=lim)
            else:
                ax.imshow(a, cmap="gray" if a.ndim == 2 else None)
            ax.set_title(caption, fontsize=6)
        axes[i, 0].set_ylabel(str(row_titles[i]), fontsize=7, rotation=0, ha="right", va="center")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
