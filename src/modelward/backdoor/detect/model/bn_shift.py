"""Model-level detection from the model's own memory of its training data: the batch-normalisation shift.

A BatchNorm layer keeps running estimates (μ_k, σ²_k) of its input channel k over the data the model was trained
on. Zheng et al. ("Pre-activation Distributions Expose Backdoor Neurons", NeurIPS 2022) observe that poisoned rows
shift those pre-activation distributions away from the clean data's; they prune the neurons shifted most. Here the
same shift is the *detection* statistic. For every BN layer ℓ, with (m_k, s²_k) the defender's clean data's mean and
variance of the same input (the model in eval mode, spatial positions pooled),

    D_ℓ = (1/C) Σ_k KL( N(μ_k, σ²_k) ‖ N(m_k, s²_k) )
        = (1/C) Σ_k [ log(s_k/σ_k) + (σ²_k + (μ_k − m_k)²) / (2 s²_k) − 1/2 ]                        (Zheng et al., eq. 3)

A clean model's D_ℓ is not 0: its running statistics are an exponential moving average over the last batches of
its own training sample, and the defender's data are another sample. The null is simulated from the defender's
data alone (``draws`` times): a bootstrap resample of the n clean images stands for the defender's sample, and a
running average with the layer's own momentum over batches of ``batch_size`` images drawn from the clean images
stands for the training's; p_ℓ = (1 + #{null ≥ D_ℓ}) / (1 + draws). The model is flagged when the Šidák-combined
p = 1 − (1 − min_ℓ p_ℓ)^L is below ``alpha``. No clean reference model is needed: the premise is that the suspect
was trained on data distributed like the defender's; a model trained on shifted data (another population, other
preprocessing, augmentation the defender does not apply) is flagged as well, and the verdict cannot tell the two
causes apart.

The suspect class: the last BN layer's mean shift Δ_k = μ_k − m_k is ρ times the poisoned rows' own shift when a
share ρ of the training rows carried it; the clean images' inputs to that layer are moved by Δ/ρ (``rho``, 0.05)
and the class they are then sent to most often is named (``per_class``: the shares per class).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from modelward.backdoor.detect.model.base import ModelVerdict
from modelward.errors import ConfigError

_BN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def _kl(mu_r: np.ndarray, var_r: np.ndarray, mu_c: np.ndarray, var_c: np.ndarray) -> np.ndarray:
    """KL(N(mu_r, var_r) ‖ N(mu_c, var_c)), elementwise (the last axis: channels)."""
    return 0.5 * np.log(var_c / var_r) + (var_r + (mu_r - mu_c) ** 2) / (2.0 * var_c) - 0.5


class BatchNormShift:
    """The BN-statistics shift test (above).

    Args:
        draws: simulated clean runs for the null (the smallest p is 1 / (1 + draws)).
        batch_size: the training batch size the null assumes (a larger one than the real gives a wider null, so
            fewer flags; a smaller one more).
        alpha: flagged below this Šidák-combined p-value.
        rho: the poisoned share assumed when naming the suspect class.
        seed: the null's random draws.

    Returns:
        ``detect(model, x, num_classes)`` → :class:`~modelward.backdoor.detect.model.base.ModelVerdict`
        ``"bn_shift"`` (statistic −log10 p, ``extra["layers"]``: each layer's D, p and null quantiles).

    Example:
        >>> torch.manual_seed(0)
        <torch._C.Generator object at ...>
        >>> m = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
        >>> x = torch.randn(256, 4)
        >>> _ = m.train()(x)  # running statistics of this data (one batch: momentum 0.1 leaves them far off)
        >>> v = BatchNormShift(draws=200).detect(m.eval(), torch.randn(200, 4), 3)
        >>> v.detector, len(v.per_class), v.p_value < 0.05
        ('bn_shift', 3, True)
    """

    name = "bn_shift"

    def __init__(self, draws: int = 500, batch_size: int = 64, alpha: float = 0.05, rho: float = 0.05,
                 seed: int = 0) -> None:
        if draws < 19:
            raise ConfigError(f"bn_shift: draws must be ≥ 19 (a p-value below 0.05 needs them), got {draws}")
        if batch_size < 2:
            raise ConfigError(f"bn_shift: batch_size must be ≥ 2, got {batch_size}")
        if not 0.0 < alpha < 1.0:
            raise ConfigError(f"bn_shift: alpha must be in (0, 1), got {alpha}")
        if not 0.0 < rho <= 1.0:
            raise ConfigError(f"bn_shift: rho must be in (0, 1], got {rho}")
        self.draws, self.batch_size, self.alpha, self.rho, self.seed = draws, batch_size, alpha, rho, seed

    @staticmethod
    def layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
        """The BN layers that keep running statistics, in forward order of definition."""
        return [(n, m) for n, m in model.named_modules()
                if isinstance(m, _BN) and m.track_running_stats and m.running_mean is not None]

    @staticmethod
    def _moments(model: nn.Module, bns: list[nn.Module], x: torch.Tensor) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per image and channel, the spatial mean of each BN layer's input and of its square (float64)."""
        seen: list[list[torch.Tensor]] = [[] for _ in bns]
        hooks = [b.register_forward_pre_hook(lambda mod, i, k=k: seen[k].append(i[0].detach()))
                 for k, b in enumerate(bns)]
        device = bns[0].running_mean.device
        try:
            with torch.no_grad():
                for chunk in x.split(512):  # bounded memory on a large clean set
                    model(chunk.to(device))
        finally:
            for h in hooks:
                h.remove()
        out = []
        for k in range(len(bns)):
            if not seen[k]:
                raise ConfigError(f"bn_shift: BatchNorm layer {k} is not on the model's forward path")
            a = torch.cat(seen[k]).double().cpu()
            dims = tuple(range(2, a.dim()))
            out.append(((a.mean(dims) if dims else a).numpy(), ((a * a).mean(dims) if dims else a * a).numpy()))
        return out

    def _null(self, m1: np.ndarray, m2: np.ndarray, momentum: float, rng: np.random.Generator) -> np.ndarray:
        """``draws`` values of D for a clean model (above), vectorised over draws in chunks."""
        n = len(m1)
        steps = max(int(math.ceil(math.log(1e-3) / math.log(1.0 - momentum))), 1)  # the start's weight < 0.1 %
        chunk = int(max(1, min(100, 4_000_000 // max(n * m1.shape[1], 1))))  # bounds the bootstrap's memory
        start_mu, start_var = m1.mean(0), np.maximum(m2.mean(0) - m1.mean(0) ** 2, 1e-12)
        out = []
        for lo in range(0, self.draws, chunk):
            r = min(chunk, self.draws - lo)
            boot = rng.integers(0, n, (r, n))
            mc = m1[boot].mean(1)
            vc = np.maximum(m2[boot].mean(1) - mc ** 2, 1e-12)
            mu, var = np.repeat(start_mu[None], r, 0), np.repeat(start_var[None], r, 0)
            for _ in range(steps):
                idx = rng.integers(0, n, (r, self.batch_size))
                bm = m1[idx].mean(1)
                bv = np.maximum(m2[idx].mean(1) - bm ** 2, 1e-12)
                mu = (1 - momentum) * mu + momentum * bm
                var = (1 - momentum) * var + momentum * bv
            out.append(_kl(mu, var, mc, vc).mean(1))
        return np.concatenate(out)

    def detect(self, model: nn.Module, x: torch.Tensor, num_classes: int) -> ModelVerdict:
        """The verdict on ``model`` (eval mode) from the defender's clean inputs ``x``."""
        t0 = time.perf_counter()
        named = self.layers(model)
        if not named:
            raise ConfigError("bn_shift: the model has no BatchNorm layer with running statistics; this detector "
                              "reads them (disable detect.bn_shift for this model)")
        if len(x) < 10:
            raise ConfigError(f"bn_shift: needs at least 10 clean inputs, got {len(x)}")
        model.eval()
        bns = [m for _, m in named]
        moments = self._moments(model, bns, x)
        rng = np.random.default_rng(self.seed)
        layers: list[dict[str, Any]] = []
        for (name, b), (m1, m2) in zip(named, moments, strict=True):
            mc = m1.mean(0)
            vc = np.maximum(m2.mean(0) - mc ** 2, 1e-12)
            mu = b.running_mean.detach().double().cpu().numpy()
            var = np.maximum(b.running_var.detach().double().cpu().numpy(), 1e-12)
            d = float(_kl(mu, var, mc, vc).mean())
            null = self._null(m1, m2, float(b.momentum if b.momentum is not None else 0.1), rng)
            p = (1 + int((null >= d).sum())) / (1 + len(null))
            layers.append({"layer": name, "divergence": d, "p_value": p, "null_median": float(np.median(null)),
                           "null_q95": float(np.quantile(null, 0.95)), "channels": len(mu)})
        p_min = min(lay["p_value"] for lay in layers)
        p = float(-math.expm1(len(layers) * math.log1p(-min(p_min, 1.0 - 1e-16))))
        shares = self._suspect_shares(model, bns[-1], x, moments[-1][0].mean(0), num_classes)
        return ModelVerdict(self.name, -math.log10(max(p, 1e-300)), -math.log10(self.alpha), p < self.alpha,
                            int(np.argmax(shares)), shares.tolist(), p_value=p, seconds=time.perf_counter() - t0,
                            extra={"layers": layers, "draws": self.draws, "batch_size": self.batch_size,
                                   "rho": self.rho, "inputs": len(x)})

    def _suspect_shares(self, model: nn.Module, bn: nn.Module, x: torch.Tensor, clean_mean: np.ndarray,
                        num_classes: int) -> np.ndarray:
        """Per class, the share of clean inputs sent to it when the last BN layer's input is moved by Δ/ρ."""
        shift = torch.as_tensor((bn.running_mean.detach().double().cpu().numpy() - clean_mean) / self.rho,
                                dtype=x.dtype)

        def move(mod: nn.Module, i: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
            a = i[0]
            return (a + shift.to(a.device).view(1, -1, *([1] * (a.dim() - 2))),)

        h = bn.register_forward_pre_hook(move)
        try:
            with torch.no_grad():
                pred = torch.cat([model(c.to(bn.running_mean.device)).argmax(1).cpu() for c in x.split(512)]).numpy()
        finally:
            h.remove()
        return np.bincount(pred, minlength=num_classes)[:num_classes] / len(pred)
