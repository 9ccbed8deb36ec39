"""Activation clustering (Chen, Carvalho, Baracaldo, Ludwig, Edwards, Lee, Molloy & Srivastava 2019, "Detecting
Backdoor Attacks on Deep Neural Networks by Activation Clustering", §4).

For every class label, the activations of the rows carrying it (the paper: the last hidden layer; here by default
the last convolutional block's output, ``layer``) are reduced to ``dims`` dimensions
(PCA here; the paper uses ICA, ART offers both) and split into two clusters by k-means. Poisoned rows of a class
form their own cluster, because the network reaches the label through the trigger rather than through the class's
features. The paper's rules read a class as poisoned when the smaller cluster holds less than ``size_threshold``
(0.35) of the class (``rule="size"``) or when the two clusters are well separated, by the silhouette score
(``rule="silhouette"``, ≥ ``silhouette_threshold``); the suspected rows are the smaller cluster of a poisoned class.

Each row's score, comparable across classes, is the class's silhouette score times the row's position on the axis
from the larger cluster's centroid (0) to the smaller one's (1): the rows of the small, well-separated cluster of a
poisoned class score near the silhouette; rows of a class that splits only by chance score near 0.
"""

from __future__ import annotations

import time
from typing import Literal

import numpy as np
import torch
from torch import nn

from modelward.backdoor.detect.data.base import DataScan, class_features


class ActivationClustering:
    """Two-means clustering of each class's activations.

    Args:
        dims: dimensions kept by PCA before clustering (10, as the paper and ART).
        rule: ``"size"`` or ``"silhouette"`` (which classes are called poisoned; see the module docstring).
        size_threshold: the smaller cluster's share below which a class is poisoned (0.35, ART's default).
        silhouette_threshold: the silhouette score above which a class is poisoned.
        seed: seeds k-means.
        layer: the representation read when ``scan`` is given the model, not features: ``"last_conv"`` (the last
            convolutional block's output, flattened; the default) or ``"penultimate"`` (the input of the last
            linear layer; ``modelward.backdoor.features``).

    Returns:
        A detector: ``scan(model, x, y)`` → :class:`~modelward.backdoor.detect.data.base.DataScan`.

    Example:
        >>> scan = ActivationClustering().scan(model, x_train, y_train)  # doctest: +SKIP
        >>> scan.top(20)  # the 20 most suspicious rows  # doctest: +SKIP
    """

    name = "activation_clustering"

    def __init__(self, dims: int = 10, rule: Literal["size", "silhouette"] = "size", size_threshold: float = 0.35,
                 silhouette_threshold: float = 0.25, seed: int = 0, layer: str = "last_conv") -> None:
        self.dims, self.rule, self.size_threshold = dims, rule, size_threshold
        self.silhouette_threshold, self.seed, self.layer = silhouette_threshold, seed, layer

    def scan(self, model: nn.Module | None, x: torch.Tensor, y: torch.Tensor,
             features: np.ndarray | None = None) -> DataScan:
        """Score every row of ``(x, y)`` (or of the given ``features``)."""
        from sklearn.cluster import KMeans
        from sklearn.decomposition import PCA
        from sklearn.metrics import silhouette_score

        t0 = time.perf_counter()
        feats, labels = class_features(model, x, y, features, self.layer)
        scores = np.zeros(len(labels))
        suspected = np.zeros(len(labels), bool)
        per_class = []
        for c in np.unique(labels):
            rows = np.flatnonzero(labels == c)
            if len(rows) < 4:
                per_class.append({"class": int(c), "rows": int(len(rows)), "note": "too few rows to cluster"})
                continue
            f = feats[rows]
            d = min(self.dims, f.shape[1], len(rows) - 1)
            z = PCA(n_components=d, random_state=self.seed).fit_transform(f - f.mean(0))
            km = KMeans(n_clusters=2, n_init=10, random_state=self.seed).fit(z)
            lab = km.labels_
            sizes = np.bincount(lab, minlength=2)
            if sizes.min() == 0:
                per_class.append({"class": int(c), "rows": int(len(rows)), "note": "one cluster"})
                continue
            small = int(np.argmin(sizes))
            share = float(sizes[small] / len(rows))
            sil = float(silhouette_score(z, lab)) if len(rows) > 2 else 0.0
            axis = km.cluster_centers_[small] - km.cluster_centers_[1 - small]
            t = (z - km.cluster_centers_[1 - small]) @ axis / max(float(axis @ axis), 1e-12)
            scores[rows] = max(sil, 0.0) * t
            poisoned = share < self.size_threshold if self.rule == "size" else sil >= self.silhouette_threshold
            if poisoned:
                suspected[rows[lab == small]] = True
            per_class.append({"class": int(c), "rows": int(len(rows)), "smaller_share": share, "silhouette": sil,
                              "poisoned": bool(poisoned)})
        return DataScan(self.name, scores, suspected, per_class, time.perf_counter() - t0)
