"""The thesis' membership-inference protocol (seed 002 §8.3.3): random disjoint splits of all data into target
training (members, ¼), test (non-members, ¼) and the attacker's hold-out (½); 10 repetitions over random splits."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from modelward.errors import ConfigError


@dataclass(frozen=True)
class MembershipSplit:
    """Members (target training set), non-members (test), hold-out (attacker's data from D*)."""

    x_in: torch.Tensor
    y_in: torch.Tensor
    x_out: torch.Tensor
    y_out: torch.Tensor
    x_aux: torch.Tensor
    y_aux: torch.Tensor
    # positions of the members / non-members / hold-out in the pooled data (to name exposed records)
    idx_in: torch.Tensor | None = None
    idx_out: torch.Tensor | None = None
    idx_aux: torch.Tensor | None = None

    def evaluation_indices(self) -> np.ndarray:
        """Pooled-data positions of the :meth:`evaluation` points, in the same order."""
        if self.idx_in is None or self.idx_out is None:
            raise ConfigError("this split was built without indices")
        n = min(len(self.x_in), len(self.x_out))
        return np.r_[self.idx_in[:n].numpy(), self.idx_out[:n].numpy()]

    def evaluation(self) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """The balanced evaluation set: members then non-members, and the true membership."""
        n = min(len(self.x_in), len(self.x_out))
        x = torch.cat([self.x_in[:n], self.x_out[:n]])
        y = torch.cat([self.y_in[:n], self.y_out[:n]])
        return x, y, np.r_[np.ones(n, bool), np.zeros(n, bool)]


def membership_split(x: torch.Tensor, y: torch.Tensor, seed: int, train: float = 0.25, test: float = 0.25
                     ) -> MembershipSplit:
    """Random disjoint train/test/hold-out split (fractions train, test, rest), seeded.

    Args:
        x: all inputs; y: their labels.
        seed: seeds the permutation.
        train: share of members (the target's training set); test: share of non-members; the rest is the
            attacker's hold-out. Needs ``train > 0``, ``test > 0``, ``train + test < 1`` (else ``ConfigError``).

    Returns:
        A :class:`MembershipSplit` (``x_in``/``y_in``, ``x_out``/``y_out``, ``x_aux``/``y_aux``); its
        ``evaluation()`` gives the balanced member/non-member evaluation set.

    Example:
        >>> import torch
        >>> s = membership_split(torch.randn(20, 4), torch.randint(2, (20,)), seed=0)
        >>> len(s.x_in), len(s.x_out), len(s.x_aux)
        (5, 5, 10)
    """
    if train <= 0 or test <= 0 or train + test >= 1:
        raise ConfigError(f"split fractions: need train > 0, test > 0, train + test < 1 (got {train}, {test})")
    n = len(x)
    perm = torch.as_tensor(np.random.default_rng(seed).permutation(n))
    a, b = int(round(train * n)), int(round((train + test) * n))
    i, o, h = perm[:a], perm[a:b], perm[b:]
    return MembershipSplit(x[i], y[i], x[o], y[o], x[h], y[h], i, o, h)
