"""Calibration for precision (seed 002 App. C, Fig. 8.9): raise the threshold from ½ to the α-th percentile of the
attack's confidence on the **hold-out** points (presumed non-members); α = 0.99 should give about 1 % FPR."""

from __future__ import annotations

import numpy as np
import torch

from modelward.errors import ConfigError
from modelward.privacy.membership.base import AttackData, MembershipAttack


def calibrated_threshold(holdout_scores: np.ndarray, alpha: float) -> float:
    """The α-quantile of the hold-out scores (member iff score > threshold)."""
    if not 0 < alpha < 1:
        raise ConfigError(f"calibration alpha must lie in (0, 1), got {alpha}")
    return float(np.quantile(np.asarray(holdout_scores, dtype=np.float64), alpha))


class Calibrated(MembershipAttack):
    """Wrap any scoring attack; its threshold becomes the α-percentile of its hold-out scores.

    Args:
        base: a (not yet fitted) attack with real-valued scores (not ``naive``: 0/1 scores cannot be calibrated).
        alpha: the percentile (thesis: 0.90 and 0.99).
    Example:
        >>> Calibrated(BayesianWB(), alpha=0.99).fit(data).decide(x, y)
    """

    def __init__(self, base: MembershipAttack, alpha: float = 0.99) -> None:
        if base.name == "naive":
            raise ConfigError("the naive attack gives no confidence score and cannot be calibrated (App. C)")
        calibrated_threshold(np.zeros(1), alpha)
        self.base, self.alpha = base, alpha
        self.name = f"{base.name}@{alpha:g}"

    def fit(self, data: AttackData) -> Calibrated:
        self.data = data
        if not hasattr(self.base, "data") or self.base.data is not data:
            self.base.fit(data)
        self.threshold = calibrated_threshold(self.base.score(data.x_aux, data.y_aux), self.alpha)
        return self

    def score(self, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        return self.base.score(x, y)
