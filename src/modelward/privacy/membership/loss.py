"""Loss-threshold attack (Yeom et al. 2018, Alg. 1): member iff the target's loss on (x, y) is below τ.

Score = −loss. τ defaults to the mean training loss of shadow models trained with the target's algorithm (an
estimate of the target's expected training loss, as Yeom et al. assume the attacker knows it); without shadows
it falls back to the median loss on the hold-out data (an FPR of about ½). Not in the thesis (digest §0).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from modelward.privacy.membership.base import AttackData, MembershipAttack
from modelward.privacy.shadows import logits_of


def per_example_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """Cross-entropy per example, computed in float64 from the model's logits.

    In float32 the loss of a confident prediction rounds to exactly 0 once the logit margin passes ≈ 17 (e^−17 is
    below float32's resolution at 1), so an overfit model's members and its confidently-right non-members all tie
    at the top of the score order, and no threshold can separate them at a low FPR (issue 38: an overfit model
    read as TPR 0 at 1 % FPR). In float64 the same logits keep their order up to margins of ≈ 700.
    """
    return F.cross_entropy(logits_of(model, x).double(), y, reduction="none").numpy()


class LossAttack(MembershipAttack):
    """Args: tau: the loss threshold (None = estimate it in :meth:`fit`).

    Example:
        >>> LossAttack(tau=0.05).fit(data).decide(x, y)
    """

    name = "loss"

    def __init__(self, tau: float | None = None) -> None:
        self.tau = tau

    def fit(self, data: AttackData) -> LossAttack:
        self.data = data
        if self.tau is None:
            if data.shadows is not None:
                pool = data.shadows
                losses = [per_example_loss(m, pool.x_pool[mask], pool.y_pool[mask]).mean()
                          for m, mask in zip(pool.models, torch.as_tensor(pool.masks), strict=True)]
                self.tau = float(np.mean(losses))
            else:
                self.tau = float(np.median(per_example_loss(data.target, data.x_aux, data.y_aux)))
        self.threshold = -float(self.tau)
        return self

    def score(self, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        return -per_example_loss(self.data.target, x, y)
