"""Per-point attack objectives of AutoAttack (Croce & Hein 2020, §3–4): cross-entropy, DLR, targeted DLR, margin.

Every function takes logits ``z`` (n × K) and returns one value per row, to be *maximised* by the attacker (the
margin is the exception: Square minimises it, as in Andriushchenko et al. 2020).

- ``DLR(z, y) = −(z_y − max_{i≠y} z_i) / (z_π1 − z_π3)`` (eq. 6), shift- and scale-invariant in the logits;
- targeted ``DLR(z, y, t) = −(z_y − z_t) / (z_π1 − (z_π3 + z_π4)/2)`` (eq. 7);
- targeted cross-entropy ``−CE(z, t)`` (the reference code's, for fewer than 4 classes);
- ``margin(z, y) = z_y − max_{i≠y} z_i`` (negative iff misclassified).

Example:
    >>> import torch
    >>> z = torch.tensor([[3.0, 1.0, 0.0, -1.0]])
    >>> float(dlr(z, torch.tensor([0]))), float(margin(z, torch.tensor([0])))
    (-0.6666666865348816, 2.0)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from modelward.errors import ConfigError

_TINY = 1e-12


def _best_other(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    other = z.clone()
    other.scatter_(1, y[:, None], float("-inf"))
    return other.amax(1)


def margin(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``z_y − max_{i≠y} z_i`` per row (< 0 iff the row is misclassified)."""
    return z.gather(1, y[:, None]).squeeze(1) - _best_other(z, y)


def cross_entropy(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy per row."""
    return F.cross_entropy(z, y, reduction="none")


def dlr(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Difference of logits ratio (Croce & Hein 2020, eq. 6), per row; needs ≥ 3 classes."""
    if z.shape[1] < 3:
        raise ConfigError(f"DLR loss needs at least 3 classes, the model has {z.shape[1]}")
    top = z.sort(1, descending=True).values
    return -margin(z, y) / (top[:, 0] - top[:, 2] + _TINY)


def dlr_targeted(z: torch.Tensor, y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Targeted DLR (Croce & Hein 2020, eq. 7), per row; needs ≥ 4 classes."""
    if z.shape[1] < 4:
        raise ConfigError(f"targeted DLR loss needs at least 4 classes, the model has {z.shape[1]}")
    top = z.sort(1, descending=True).values
    gap = z.gather(1, y[:, None]).squeeze(1) - z.gather(1, target[:, None]).squeeze(1)
    return -gap / (top[:, 0] - 0.5 * (top[:, 2] + top[:, 3]) + _TINY)


def ce_targeted(z: torch.Tensor, y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Targeted cross-entropy ``−CE(z, t)`` per row (the reference code's ``ce_loss_targeted``): maximised as the
    target's log-probability rises; defined for any number of classes."""
    return -F.cross_entropy(z, target, reduction="none")


def top_other_classes(z: torch.Tensor, y: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` highest-scoring classes other than ``y`` per row, best first (n × k): AutoAttack's targets."""
    if k < 1 or k > z.shape[1] - 1:
        raise ConfigError(f"n_target_classes must be in 1..{z.shape[1] - 1} (classes − 1), got {k}")
    s = z.clone()
    s.scatter_(1, y[:, None], float("-inf"))
    return s.topk(k, dim=1).indices
