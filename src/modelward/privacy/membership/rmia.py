"""RMIA (Zarifzadeh et al. 2024, "Low-Cost High-Power Membership Inference Attacks").

Likelihood ratio of x against population points z:  LR(x, z) = [Pr(x|θ)/Pr(x)] / [Pr(z|θ)/Pr(z)], with
Pr(·|θ) the softmax probability of the true label and Pr(x) the mean over reference models. The score is the
fraction of population points z (from the hold-out) with LR(x, z) > γ. Offline (reference models that all exclude
x): Pr(x) = ½((1 + a)·mean_out Pr(x|θ') + (1 − a)), the paper's linear approximation of the in/out mixture;
online: the mean over all reference models (half of which trained on x). Threshold default ½.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from modelward.errors import ConfigError
from modelward.privacy.membership.base import AttackData, MembershipAttack
from modelward.privacy.shadows import logits_of


def true_prob(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    return F.softmax(logits_of(model, x), 1).gather(1, y[:, None])[:, 0].double().numpy()


class RMIA(MembershipAttack):
    """Args:
        online: use IN and OUT reference models where pool membership is known; a: offline mixing (paper: 0.2–0.6);
        gamma: the LR threshold γ; population: number of z points drawn from the hold-out.
    Example:
        >>> RMIA(online=False, a=0.3).fit(data).score(x, y)
    """

    name = "rmia"
    threshold = 0.5

    def __init__(self, online: bool = False, a: float = 0.3, gamma: float = 1.0, population: int = 1000) -> None:
        if not 0 <= a <= 1 or gamma <= 0 or population < 1:
            raise ConfigError("rmia: need 0 <= a <= 1, gamma > 0, population >= 1")
        self.online, self.a, self.gamma, self.population = online, a, gamma, population
        self.name = "rmia_online" if online else "rmia"

    def _pr_ref(self, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        pool = self.data.need_shadows(self.name)
        probs = np.stack([true_prob(m, x, y) for m in pool.models])  # (K, n)
        rows = pool.lookup(x)
        out = np.empty(len(x))
        for i in range(len(x)):
            mask = pool.masks[:, rows[i]] if rows[i] >= 0 else np.zeros(len(pool.models), bool)
            if self.online and mask.any() and (~mask).any():
                out[i] = probs[:, i].mean()
            else:
                p_out = probs[~mask, i].mean() if (~mask).any() else probs[:, i].mean()
                out[i] = 0.5 * ((1 + self.a) * p_out + (1 - self.a))
        return out

    def fit(self, data: AttackData) -> RMIA:
        self.data = data
        rng = np.random.default_rng(data.seed + 3)
        n = min(self.population, len(data.x_aux))
        idx = torch.as_tensor(rng.choice(len(data.x_aux), n, replace=False))
        xz, yz = data.x_aux[idx], data.y_aux[idx]
        self.ratio_z = true_prob(data.target, xz, yz) / np.maximum(self._pr_ref(xz, yz), 1e-30)
        return self

    def score(self, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        ratio_x = true_prob(self.data.target, x, y) / np.maximum(self._pr_ref(x, y), 1e-30)
        return (ratio_x[:, None] / self.ratio_z[None, :] > self.gamma).mean(1)
