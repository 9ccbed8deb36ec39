"""What a data-level detector returns, and the features it reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from modelward.backdoor.features import representation
from modelward.errors import ConfigError


@dataclass(frozen=True)
class DataScan:
    """Per-row scores and the suspected rows of one data-level detector.

    Attributes:
        method: the detector's name.
        scores: one score per training row, comparable across classes (higher = more suspicious).
        suspected: bool per row, the rows the method's own rule removes.
        per_class: per class label, what the rule was computed from (sizes, silhouette, ...).
        seconds: time taken.
    """

    method: str
    scores: np.ndarray
    suspected: np.ndarray
    per_class: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def top(self, n: int) -> np.ndarray:
        """The ``n`` most suspicious row indices, most suspicious first."""
        return np.argsort(-self.scores, kind="stable")[:n]

    def summary(self) -> dict[str, Any]:
        return {"method": self.method, "rows": int(len(self.scores)), "suspected": int(self.suspected.sum()),
                "seconds": self.seconds, "per_class": self.per_class}


def class_features(model: nn.Module | None, x: torch.Tensor, y: torch.Tensor,
                   features: np.ndarray | None = None, layer: str = "last_conv") -> tuple[np.ndarray, np.ndarray]:
    """The representation at ``layer`` of every row (or the given ``features``) and the labels, as numpy arrays."""
    if features is None:
        if model is None:
            raise ConfigError("a data-level detector needs the model (its representations) or the features")
        features = representation(model, x, layer).numpy()
    feats = np.asarray(features, dtype=np.float64)
    labels = np.asarray(y.numpy() if isinstance(y, torch.Tensor) else y)
    if len(feats) != len(labels):
        raise ConfigError(f"{len(feats)} feature rows for {len(labels)} labels")
    return feats, labels


def roc_auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """The area under the ROC curve of ``scores`` for the ``positive`` rows (ties count half; NaN if one class is
    empty)."""
    from scipy.stats import rankdata

    pos = np.asarray(positive, bool)
    n1, n0 = int(pos.sum()), int((~pos).sum())
    if n1 == 0 or n0 == 0:
        return float("nan")
    r = rankdata(scores)
    return float((r[pos].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))
