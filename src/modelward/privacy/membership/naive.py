"""The naive (correctness) attack of Yeom et al. 2018, the thesis' ``naive`` baseline (§8.3.3, digest §2.6)."""

from __future__ import annotations

import numpy as np
import torch

from modelward.privacy.membership.base import MembershipAttack
from modelward.privacy.shadows import logits_of


class NaiveAttack(MembershipAttack):
    """Member iff the target classifies (x, y) correctly. Scores are 1/0 (no confidence: cannot be calibrated).

    Example:
        >>> NaiveAttack().fit(AttackData(model, x_aux, y_aux, 10)).decide(x, y)
    """

    name = "naive"
    threshold = 0.5

    def score(self, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        return (logits_of(self.data.target, x).argmax(1) == y).numpy().astype(np.float64)
