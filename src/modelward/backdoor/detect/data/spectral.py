"""Spectral signatures (Tran, Li & Madry, NeurIPS 2018, "Spectral Signatures in Backdoor Attacks", Alg. 1).

For every class label, the representations R (by default the last convolutional block's output, flattened) of its rows are centred; the score of a row is its
squared projection on the top right singular vector v of the centred matrix, τ_i = ((R_i − R̄)·v)². Poisoned rows
shift the class's mean along a direction no clean row varies in as much, so they dominate the top singular
direction; the algorithm removes the ``removal_factor`` · ε · n rows with the largest τ in each class (ε, the
expected poisoned share, is the only prior: 1.5 · ε in the paper).

To rank rows of different classes on one scale, each class's τ is divided by its mean τ (the class's variance
along v): a clean class's scores then spread like a χ²₁ around 1, a poisoned class's poisoned rows sit far
above it.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn

from modelward.backdoor.detect.data.base import DataScan, class_features


class SpectralSignature:
    """Top-singular-vector outlier scores per class.

    Args:
        epsilon: the expected share of poisoned rows in a class (the paper's ε).
        removal_factor: rows removed per class = ``removal_factor · epsilon · n`` (1.5).
        layer: the representation read when ``scan`` is given the model, not features: ``"last_conv"`` (the last
            convolutional block's output, flattened; the default) or ``"penultimate"`` (the input of the last
            linear layer; ``modelward.backdoor.features``).

    Returns:
        A detector: ``scan(model, x, y)`` → :class:`~modelward.backdoor.detect.data.base.DataScan`.

    Example:
        >>> scan = SpectralSignature(epsilon=0.1).scan(model, x_train, y_train)  # doctest: +SKIP
    """

    name = "spectral_signature"

    def __init__(self, epsilon: float = 0.1, removal_factor: float = 1.5, layer: str = "last_conv") -> None:
        self.epsilon, self.removal_factor, self.layer = epsilon, removal_factor, layer

    def scan(self, model: nn.Module | None, x: torch.Tensor, y: torch.Tensor,
             features: np.ndarray | None = None) -> DataScan:
        """Score every row of ``(x, y)`` (or of the given ``features``)."""
        t0 = time.perf_counter()
        feats, labels = class_features(model, x, y, features, self.layer)
        scores = np.zeros(len(labels))
        suspected = np.zeros(len(labels), bool)
        per_class = []
        for c in np.unique(labels):
            rows = np.flatnonzero(labels == c)
            if len(rows) < 2:
                continue
            r = feats[rows] - feats[rows].mean(0)
            _, s, vt = np.linalg.svd(r, full_matrices=False)
            tau = (r @ vt[0]) ** 2
            scores[rows] = tau / max(float(tau.mean()), 1e-12)
            k = min(len(rows), int(np.ceil(self.removal_factor * self.epsilon * len(rows))))
            suspected[rows[np.argsort(-tau, kind="stable")[:k]]] = True
            per_class.append({"class": int(c), "rows": int(len(rows)), "removed": k,
                              "top_singular_share": float(s[0] ** 2 / max(float((s ** 2).sum()), 1e-12))})
        return DataScan(self.name, scores, suspected, per_class, time.perf_counter() - t0)
