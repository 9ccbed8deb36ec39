"""LiRA, the likelihood-ratio attack (Carlini et al. 2022, "Membership Inference Attacks From First Principles").

For each example, the shadow models' **logit-scaled confidence** φ = log p_y − log(1 − p_y) splits into those that
trained on it ("in") and those that did not ("out"); each group is fitted with a Gaussian (per-example mean, per-
example or global variance). The target's φ is scored by

* online:  log N(φ; μ_in, σ_in²) − log N(φ; μ_out, σ_out²)   (a likelihood ratio, threshold 0),
* offline: log Φ((φ − μ_out)/σ_out)   (one-sided test against the out-distribution only, threshold log ½),

summed over query augmentations (optional: horizontal flip, ±1-pixel shifts for images). Online needs shadow models
trained on pools that contain the audited points (:class:`~modelward.privacy.shadows.ShadowPool` over the evaluation
points and the hold-out; pool membership is matched on exact input bytes); points not in the pool, or
``online=False``, use the offline test with all shadows as "out".
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from scipy import stats

from modelward.errors import ConfigError
from modelward.privacy.membership.base import AttackData, MembershipAttack
from modelward.privacy.shadows import logits_of

Augment = Literal["none", "flip", "shift"]


def logit_confidence(logits: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """φ = log p_y − log(1 − p_y) computed stably as z_y − logsumexp_{j≠y} z_j."""
    zy = logits.gather(1, y[:, None])[:, 0]
    rest = logits.scatter(1, y[:, None], float("-inf")).logsumexp(1)
    return (zy - rest).double().numpy()


def augmentations(x: torch.Tensor, kind: Augment) -> list[torch.Tensor]:
    if kind == "none" or x.dim() != 4:
        return [x]
    if kind == "flip":
        return [x, x.flip(-1)]
    if kind == "shift":
        return [x, torch.roll(x, 1, -1), torch.roll(x, -1, -1), torch.roll(x, 1, -2), torch.roll(x, -1, -2)]
    raise ConfigError(f"lira.augment {kind!r}: valid choices: none, flip, shift")


class LiRA(MembershipAttack):
    """Args:
        online: use in- and out-Gaussians (needs the audited points in the shadow pool); else offline.
        global_variance: one σ_in / σ_out for all examples (Carlini et al.: better with few shadow models).
        augment: ``none`` | ``flip`` | ``shift`` query augmentations.
    Example:
        >>> data.shadows = ShadowPool.train(A, torch.cat([x_eval, x_hold]), ..., count=16)
        >>> LiRA(online=True).fit(data).score(x_eval, y_eval)
    """

    name = "lira"
    threshold = 0.0

    def __init__(self, online: bool = True, global_variance: bool = True, augment: Augment = "none") -> None:
        augmentations(torch.zeros(1, 1, 2, 2), augment)
        self.online, self.global_variance, self.augment = online, global_variance, augment
        self.name = "lira_online" if online else "lira_offline"
        # online: likelihood ratio > 1; offline: the target's confidence above the out-median (Φ > ½)
        self.threshold = 0.0 if online else float(np.log(0.5))

    def _phi(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        return np.stack([logit_confidence(logits_of(model, xa), y) for xa in augmentations(x, self.augment)], -1)

    def fit(self, data: AttackData) -> LiRA:
        self.data = data
        pool = data.need_shadows(self.name)
        # (K, n_pool, A) shadow confidences on the pool, computed once
        self.phi_pool = np.stack([self._phi(m, pool.x_pool, pool.y_pool) for m in pool.models])
        masks = pool.masks[:, :, None]
        ins = np.where(masks, self.phi_pool, np.nan)
        outs = np.where(~masks, self.phi_pool, np.nan)
        with np.errstate(invalid="ignore"), _quiet():
            self.g_in = float(np.nanstd(ins - np.nanmean(ins, 0, keepdims=True)))
            self.g_out = float(np.nanstd(outs - np.nanmean(outs, 0, keepdims=True)))
        return self

    def score(self, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        pool = self.data.shadows
        assert pool is not None
        obs = self._phi(self.data.target, x, y)  # (n, A)
        rows = pool.lookup(x)
        out = np.empty(len(x))
        missing = rows < 0
        if missing.any():  # all shadows are "out" for points outside the pool
            phi_new = np.stack([self._phi(m, x[torch.as_tensor(np.nonzero(missing)[0])],
                                          y[torch.as_tensor(np.nonzero(missing)[0])]) for m in pool.models])
        j = 0
        for i in range(len(x)):
            if rows[i] >= 0:
                phis, mask = self.phi_pool[:, rows[i]], pool.masks[:, rows[i]]
            else:
                phis, mask = phi_new[:, j], np.zeros(len(pool.models), bool)
                j += 1
            out[i] = self._one(obs[i], phis, mask)
        return out

    def _one(self, obs: np.ndarray, phis: np.ndarray, mask: np.ndarray) -> float:
        o = phis[~mask]
        mu_out = o.mean(0) if len(o) else np.zeros_like(obs)
        sd_out = (self.g_out if self.global_variance or len(o) < 2 else o.std(0)) + 1e-6
        if self.online and mask.any() and (~mask).any():
            i = phis[mask]
            mu_in = i.mean(0)
            sd_in = (self.g_in if self.global_variance or len(i) < 2 else i.std(0)) + 1e-6
            return float((stats.norm.logpdf(obs, mu_in, sd_in) - stats.norm.logpdf(obs, mu_out, sd_out)).sum())
        return float(stats.norm.logcdf(obs, mu_out, sd_out).sum())


class _quiet:
    def __enter__(self) -> None:
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *a: object) -> None:
        self._w.__exit__(*a)
