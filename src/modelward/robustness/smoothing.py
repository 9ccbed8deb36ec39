"""Randomized smoothing (Cohen, Rosenfeld, Kolter, ICML 2019): a certified ℓ2 radius for any classifier.

The smoothed classifier ``g(x) = argmax_c P(f(x + δ) = c)``, ``δ ~ N(0, σ² I)``, is robust around x within
``R = σ Φ⁻¹(p_A)`` whenever the top class has probability ``p_A > 1/2`` (Theorem 1 with ``p_B = 1 − p_A``).
Algorithm 1 of the paper, implemented exactly:

- ``PREDICT(f, σ, x, n, α)``: draw n noisy copies, take the two most frequent classes A, B with counts n_A, n_B;
  return A iff the two-sided binomial test of ``n_A`` out of ``n_A + n_B`` at 1/2 has p-value ≤ α, else abstain.
  The answer differs from g(x) with probability at most α (Proposition 2).
- ``CERTIFY(f, σ, x, n0, n, α)``: guess A from n0 samples; count A in n fresh samples; ``p̲_A`` = the one-sided
  (1 − α) Clopper–Pearson lower bound; if ``p̲_A > 1/2`` return A and ``R = σ Φ⁻¹(p̲_A)``, else abstain. With
  probability ≥ 1 − α a returned class is g(x) and g is constant on the ball of radius R.

Noise is drawn from a seeded ``torch.Generator`` in batches of ``batch_size`` copies; abstentions are returned as
class −1 (:data:`ABSTAIN`). ``train_gaussian`` is the paper's training: cross-entropy on inputs plus N(0, σ²) noise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from scipy.stats import beta, binomtest, norm
from torch import nn

from modelward.core.device import model_device
from modelward.core.train import TrainConfig
from modelward.errors import ConfigError
from modelward.robustness.attacks.base import attack_mode
from modelward.robustness.training import _loop

ABSTAIN = -1


@dataclass(frozen=True)
class SmoothingCertificate:
    """Per point: the certified class (−1 = abstain), the ℓ2 radius (0 when abstaining), p̲_A and the counts.

    ``certified_accuracy(eps)`` is the fraction of points certified correct with radius ≥ ε (the paper's Fig. 1
    curves); ``labels`` are the true labels it is measured against.
    """

    predictions: torch.Tensor
    radii: torch.Tensor
    p_lower: torch.Tensor
    labels: torch.Tensor
    sigma: float
    alpha: float
    n0: int
    n: int

    def certified(self, eps: float) -> torch.Tensor:
        """Bool per point: certified correct with radius ≥ ε (a radius of exactly ε counts: the bound is closed)."""
        return (self.predictions == self.labels) & (self.radii >= eps)

    def certified_accuracy(self, eps: float) -> float:
        return float(self.certified(eps).float().mean()) if len(self.labels) else 0.0

    @property
    def abstain_rate(self) -> float:
        return float((self.predictions == ABSTAIN).float().mean()) if len(self.labels) else 0.0


def clopper_pearson_lower(k: int, n: int, alpha: float) -> float:
    """One-sided (1 − α) Clopper–Pearson lower confidence bound on p from k successes in n trials."""
    return float(beta.ppf(alpha, k, n - k + 1)) if k > 0 else 0.0


class SmoothedClassifier:
    """``g`` of Cohen et al. 2019 around a base classifier ``f`` (returns logits), noise level σ.

    Args:
        model: the base classifier f.
        num_classes: number of classes.
        sigma: the noise level σ > 0.
        batch_size: noisy copies evaluated per forward pass.
        seed: seeds the noise (a ``torch.Generator``; the global RNG is never touched).

    Returns:
        :meth:`predict` (classes, −1 = abstain) and :meth:`certify` (a :class:`SmoothingCertificate`).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> f = nn.Linear(2, 2)
        >>> with torch.no_grad():
        ...     _ = f.weight.copy_(torch.tensor([[1.0, 0.0], [-1.0, 0.0]])); _ = f.bias.zero_()
        >>> g = SmoothedClassifier(f, num_classes=2, sigma=0.5)
        >>> cert = g.certify(torch.tensor([[0.5, 0.0]]), torch.tensor([0]), n0=100, n=2000, alpha=0.001)
        >>> int(cert.predictions[0]), 0.3 < float(cert.radii[0]) <= 0.5  # the exact radius is 0.5
        (0, True)
    """

    def __init__(self, model: nn.Module, num_classes: int, sigma: float, batch_size: int = 1000,
                 seed: int = 0) -> None:
        if sigma <= 0:
            raise ConfigError(f"smoothing: sigma must be > 0, got {sigma}")
        if num_classes < 2:
            raise ConfigError(f"smoothing: num_classes must be >= 2, got {num_classes}")
        if batch_size < 1:
            raise ConfigError(f"smoothing: batch_size must be >= 1, got {batch_size}")
        self.model, self.num_classes, self.sigma = model, num_classes, float(sigma)
        self.batch_size, self.seed = batch_size, seed

    @torch.no_grad()
    def sample_counts(self, x: torch.Tensor, num: int, gen: torch.Generator) -> torch.Tensor:
        """SAMPLEUNDERNOISE: class counts of f on ``num`` copies of the single input ``x`` plus N(0, σ²I)."""
        counts = torch.zeros(self.num_classes, dtype=torch.long)
        dev = model_device(self.model)
        x = x.to(dev)
        left = num
        while left > 0:
            b = min(self.batch_size, left)
            noise = torch.randn((b, *x.shape), generator=gen, device=gen.device, dtype=x.dtype).to(dev)
            pred = self.model(x.unsqueeze(0) + self.sigma * noise).argmax(1)
            counts += torch.bincount(pred.cpu(), minlength=self.num_classes)[: self.num_classes]
            left -= b
        return counts

    def _check(self, n: int, alpha: float, n0: int | None = None) -> None:
        if n < 1 or (n0 is not None and n0 < 1):
            raise ConfigError(f"smoothing: need n >= 1 and n0 >= 1, got n={n}, n0={n0}")
        if not 0 < alpha < 1:
            raise ConfigError(f"smoothing: alpha must be in (0, 1), got {alpha}")

    def predict(self, x: torch.Tensor, n: int = 1000, alpha: float = 0.001) -> torch.Tensor:
        """PREDICT of Algorithm 1 for every row of ``x``: the class, or −1 (abstain).

        Args:
            x: inputs (one row per point).
            n: noise samples per point.
            alpha: the bound on the probability of returning a class other than g(x).

        Returns:
            Long tensor of classes (−1 = abstain).
        """
        self._check(n, alpha)
        gen = torch.Generator().manual_seed(self.seed)
        out = torch.full((len(x),), ABSTAIN, dtype=torch.long)
        with attack_mode(self.model):
            for i in range(len(x)):
                counts = self.sample_counts(x[i], n, gen)
                top2 = counts.topk(2)
                n_a, n_b = int(top2.values[0]), int(top2.values[1])
                if binomtest(n_a, n_a + n_b, 0.5).pvalue <= alpha:
                    out[i] = int(top2.indices[0])
        return out

    def certify(self, x: torch.Tensor, y: torch.Tensor, n0: int = 100, n: int = 100_000,
                alpha: float = 0.001) -> SmoothingCertificate:
        """CERTIFY of Algorithm 1 for every row of ``x``: class and certified ℓ2 radius (or abstain).

        Args:
            x: inputs.
            y: their true labels (kept for :meth:`SmoothingCertificate.certified_accuracy`).
            n0: samples to guess the top class.
            n: samples to bound its probability.
            alpha: the failure probability of each certificate.

        Returns:
            A :class:`SmoothingCertificate`.
        """
        self._check(n, alpha, n0)
        gen = torch.Generator().manual_seed(self.seed)
        preds = torch.full((len(x),), ABSTAIN, dtype=torch.long)
        radii, lows = torch.zeros(len(x), dtype=torch.float64), torch.zeros(len(x), dtype=torch.float64)
        with attack_mode(self.model):
            for i in range(len(x)):
                guess = int(self.sample_counts(x[i], n0, gen).argmax())
                n_a = int(self.sample_counts(x[i], n, gen)[guess])
                p_low = clopper_pearson_lower(n_a, n, alpha)
                lows[i] = p_low
                if p_low > 0.5:
                    preds[i], radii[i] = guess, self.sigma * float(norm.ppf(p_low))
        return SmoothingCertificate(preds, radii, lows, y.detach().cpu().long(), self.sigma, alpha, n0, n)


def train_gaussian(model: nn.Module, x_train: torch.Tensor, y_train: torch.Tensor, train_cfg: TrainConfig,
                   sigma: float, seed: int = 0, on_step: Callable[[int, float], None] | None = None):  # noqa: ANN201
    """Gaussian data augmentation (Cohen et al. 2019, §4): cross-entropy of f on ``x + N(0, σ²I)``.

    Args:
        model: the base classifier (trained in place).
        x_train, y_train: training data.
        train_cfg: optimizer, steps, batch size (:class:`~modelward.core.train.TrainConfig`).
        sigma: the noise level (train at the σ you will certify with).
        seed: seeds batches and noise.
        on_step: called with ``(step, loss)`` after every update.

    Returns:
        :class:`~modelward.robustness.training.AdvTrainResult` (steps, seconds, losses; the "adversarial"
        accuracy is the accuracy on the noisy batches).

    Example:
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
        >>> res = train_gaussian(model, torch.rand(64, 16), torch.randint(3, (64,)),
        ...                      TrainConfig(steps=3, batch_size=16), sigma=0.25)
        >>> res.steps_run
        3
    """
    if sigma < 0:
        raise ConfigError(f"train_gaussian: sigma must be >= 0, got {sigma}")
    gen = torch.Generator().manual_seed(seed)

    def batch_loss(xb: torch.Tensor, yb: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        noise = torch.randn(xb.shape, generator=gen, dtype=xb.dtype).to(xb.device)
        logits = model(xb + sigma * noise)
        return F.cross_entropy(logits, yb), logits.argmax(1) == yb

    return _loop(model, x_train, y_train, train_cfg, seed, batch_loss, None, None, on_step)
