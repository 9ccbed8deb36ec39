"""SPECTRE (Hayase, Kong, Somani & Oh, ICML 2021, "SPECTRE: Defending Against Backdoor Attacks Using Robust
Statistics", Alg. 1–2).

Spectral signatures centre a class with its ordinary mean and covariance, which the poisoned rows themselves move;
once they are a large share of the class the signature fades. SPECTRE estimates the class's *clean* mean and
covariance robustly, whitens the representations with them, and scores rows with the quantum-entropy (QUE) score
of the whitened data:

    Σ̃ = cov(W),  Q = exp(α (Σ̃ − I) / (‖Σ̃‖₂ − 1)),  τ_i = W_i^⊤ Q W_i / tr(Q)

(α = 4, the paper's value). Whitened by a clean covariance, a clean row's τ is about 1 in every class, so the
scores compare across classes. Here the robust estimate is the minimum covariance determinant (Rousseeuw's
FastMCD, ``sklearn.covariance.MinCovDet``) on the top ``dims`` principal components, where the paper uses its own
robust estimator — both tolerate up to half of the rows being poisoned. The rows removed per class are the
``removal_factor · ε · n`` with the largest τ, as in spectral signatures.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn

from modelward.backdoor.detect.data.base import DataScan, class_features


class Spectre:
    """Robust whitening and QUE scores per class.

    Args:
        dims: principal components kept before the robust estimate (the paper picks k by a search; 8 here).
        alpha: the QUE parameter (4).
        epsilon, removal_factor: as :class:`~modelward.backdoor.detect.data.spectral.SpectralSignature`.
        seed: seeds the MCD's random subsets.

    Returns:
        A detector: ``scan(model, x, y)`` → :class:`~modelward.backdoor.detect.data.base.DataScan`.

    Example:
        >>> scan = Spectre().scan(model, x_train, y_train)  # doctest: +SKIP
    """

    name = "spectre"

    def __init__(self, dims: int = 8, alpha: float = 4.0, epsilon: float = 0.1, removal_factor: float = 1.5,
                 seed: int = 0) -> None:
        self.dims, self.alpha, self.epsilon, self.removal_factor, self.seed = dims, alpha, epsilon, \
            removal_factor, seed

    def scan(self, model: nn.Module | None, x: torch.Tensor, y: torch.Tensor,
             features: np.ndarray | None = None) -> DataScan:
        """Score every row of ``(x, y)`` (or of the given penultimate ``features``)."""
        from scipy.linalg import expm
        from sklearn.covariance import MinCovDet

        t0 = time.perf_counter()
        feats, labels = class_features(model, x, y, features)
        scores = np.zeros(len(labels))
        suspected = np.zeros(len(labels), bool)
        per_class = []
        for c in np.unique(labels):
            rows = np.flatnonzero(labels == c)
            f = feats[rows] - feats[rows].mean(0)
            d = min(self.dims, f.shape[1], max(1, len(rows) // 5))
            if len(rows) < 2 * d + 2:
                per_class.append({"class": int(c), "rows": int(len(rows)), "note": "too few rows"})
                continue
            _, _, vt = np.linalg.svd(f, full_matrices=False)
            z = f @ vt[:d].T
            mcd = MinCovDet(random_state=self.seed).fit(z)
            evals, evecs = np.linalg.eigh(mcd.covariance_)
            evals = np.maximum(evals, 1e-9 * max(float(evals.max()), 1e-12))
            w = (z - mcd.location_) @ evecs / np.sqrt(evals)  # whitened by the robust estimate
            cov = np.cov(w, rowvar=False).reshape(d, d)
            top = float(np.linalg.eigvalsh(cov).max())
            q = expm(self.alpha * (cov - np.eye(d)) / max(top - 1.0, 1e-6))
            tau = np.einsum("ij,jk,ik->i", w, q, w) / float(np.trace(q))
            scores[rows] = tau
            k = min(len(rows), int(np.ceil(self.removal_factor * self.epsilon * len(rows))))
            suspected[rows[np.argsort(-tau, kind="stable")[:k]]] = True
            per_class.append({"class": int(c), "rows": int(len(rows)), "removed": k, "dims": d,
                              "whitened_top_eigenvalue": top})
        return DataScan(self.name, scores, suspected, per_class, time.perf_counter() - t0)
