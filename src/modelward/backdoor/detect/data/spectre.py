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
from collections.abc import Callable
from typing import Literal

import numpy as np
import torch
from torch import nn

from modelward.backdoor.detect.data.base import DataScan, class_features


class Spectre:
    """Robust whitening and QUE scores per class.

    Args:
        dims: principal components k kept before the robust estimate; ``"auto"`` is the authors'
            search (``rcov_auto_quantum_filter``): k ∈ round((1, …, 8)²) capped at 64 and at a fifth of the
            class's rows, each k filtered, and the k kept whose filtered rows leave the largest QUE statistic
            tr(Σ′Q)/tr(Q) of the 64-dimensional representations whitened by the kept rows' covariance.
        alpha: the QUE parameter (4).
        epsilon, removal_factor: as :class:`~modelward.backdoor.detect.data.spectral.SpectralSignature`.
        seed: seeds the MCD's random subsets.

    Returns:
        A detector: ``scan(model, x, y)`` → :class:`~modelward.backdoor.detect.data.base.DataScan`.

    Example:
        >>> scan = Spectre().scan(model, x_train, y_train)  # doctest: +SKIP
    """

    name = "spectre"

    PCA_DIMS = 64  # the authors' code projects every class on its top 64 principal components first

    def __init__(self, dims: int | Literal["auto"] = 8, alpha: float = 4.0, epsilon: float = 0.1, removal_factor: float = 1.5,
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
            cap = min(f.shape[1], max(1, len(rows) // 5))
            if len(rows) < 4 or cap < 1:
                per_class.append({"class": int(c), "rows": int(len(rows)), "note": "too few rows"})
                continue
            _, _, vt = np.linalg.svd(f, full_matrices=False)
            z_all = f @ vt[:min(self.PCA_DIMS, cap)].T
            k = min(len(rows), int(np.ceil(self.removal_factor * self.epsilon * len(rows))))
            best: tuple[float, int, np.ndarray, float] | None = None
            for d in self._candidates(cap):
                tau, top = self._que(z_all[:, :d], expm, MinCovDet)
                keep = np.ones(len(rows), bool)
                keep[np.argsort(-tau, kind="stable")[:k]] = False
                stat = self._que_statistic(z_all, keep, expm) if self.dims == "auto" else 0.0
                if best is None or stat > best[0]:
                    best = (stat, d, tau, top)
            assert best is not None
            stat, d, tau, top = best
            scores[rows] = tau
            suspected[rows[np.argsort(-tau, kind="stable")[:k]]] = True
            per_class.append({"class": int(c), "rows": int(len(rows)), "removed": k, "dims": d,
                              "whitened_top_eigenvalue": top, "que_statistic": stat})
        return DataScan(self.name, scores, suspected, per_class, time.perf_counter() - t0)

    def _candidates(self, cap: int) -> list[int]:
        if self.dims != "auto":
            return [min(int(self.dims), cap)]
        ks = sorted({int(round(v ** 2)) for v in np.linspace(1.0, 8.0, 8)})
        return [k for k in ks if k <= cap] or [1]

    def _que(self, z: np.ndarray, expm: Callable[[np.ndarray], np.ndarray], mcd_cls: type
             ) -> tuple[np.ndarray, float]:
        """QUE scores of ``z`` whitened by its robust (MCD) mean and covariance (Alg. 2)."""
        d = z.shape[1]
        if d == 1:  # the authors' k = 1 case: no whitening, Q = 1
            zc = z[:, 0] - np.median(z[:, 0])
            scale = max(float(np.median(np.abs(zc))) * 1.4826, 1e-12)
            return (zc / scale) ** 2, 1.0
        mcd = mcd_cls(random_state=self.seed).fit(z)
        evals, evecs = np.linalg.eigh(mcd.covariance_)
        evals = np.maximum(evals, 1e-9 * max(float(evals.max()), 1e-12))
        w = (z - mcd.location_) @ evecs / np.sqrt(evals)  # whitened by the robust estimate
        cov = np.cov(w, rowvar=False).reshape(d, d)
        top = float(np.linalg.eigvalsh(cov).max())
        q = expm(self.alpha * (cov - np.eye(d)) / max(top - 1.0, 1e-6))
        return np.einsum("ij,jk,ik->i", w, q, w) / float(np.trace(q)), top

    def _que_statistic(self, z: np.ndarray, keep: np.ndarray, expm: Callable[[np.ndarray], np.ndarray]) -> float:
        """tr(Σ′Q)/tr(Q) of ``z`` whitened by the covariance of the ``keep`` rows (the authors' choice of k)."""
        sigma = np.cov(z[keep], rowvar=False).reshape(z.shape[1], z.shape[1])
        evals, evecs = np.linalg.eigh(sigma)
        evals = np.maximum(evals, 1e-9 * max(float(evals.max()), 1e-12))
        w = (z - z[keep].mean(0)) @ evecs / np.sqrt(evals)
        cov = np.cov(w, rowvar=False).reshape(z.shape[1], z.shape[1])
        top = float(np.linalg.eigvalsh(cov).max())
        q = expm(self.alpha * (cov - np.eye(len(cov))) / max(top - 1.0, 1e-6))
        return float(np.trace(cov @ q) / np.trace(q))
