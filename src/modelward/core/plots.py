"""Matplotlib figures shared by reports (headless: Agg backend)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def grouped_bars(path: str | Path, groups: Sequence[str], series: dict[str, tuple[Sequence[float], Sequence[float]]],
                 title: str, ylabel: str, ylim: tuple[float, float] | None = None) -> Path:
    """Bars per group (x axis) with one colour per series; values with ± error bars (e.g. SD over seeds)."""
    import numpy as np

    path = Path(path)
    n = max(1, len(series))
    x = np.arange(len(groups))
    width = 0.8 / n
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(groups) * max(1, n / 2)), 4.0))
    for i, (label, (vals, errs)) in enumerate(series.items()):
        ax.bar(x + (i - (n - 1) / 2) * width, vals, width, yerr=errs, capsize=2, label=label)
    ax.set_xticks(x, groups, rotation=30 if len(groups) > 6 else 0, ha="right" if len(groups) > 6 else "center")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if ylim:
        ax.set_ylim(*ylim)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def line_plot(path: str | Path, series: dict[str, tuple[Sequence[float], Sequence[float]]], title: str,
              xlabel: str, ylabel: str, logx: bool = False) -> Path:
    """One line per series of (x, y) values."""
    path = Path(path)
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", markersize=3, label=label)
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if series:  # an empty plot has no line to name (a legend would only warn)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
