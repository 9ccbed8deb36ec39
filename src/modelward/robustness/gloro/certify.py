"""Certification with GloRo nets: certified mask, VRA, rejection rate, relaxed (RTK / affinity) VRA, and an
empirical Lipschitz lower bound (seed 002 §5, §6.4.3 Eq. 6.12, §7.4.1).

- VRA (verified-robust accuracy): fraction of points predicted correctly *and* certified (non-⊥).
- RTK / affinity VRA: certified and the label lies in the loosest certified top-k* set (for standard GloRo k* = 1,
  so this is the plain VRA).
- :func:`empirical_lipschitz`: max over random and gradient-ascended pairs of the margin change
  ``|Δ(f_j − f_i)| / ‖x1 − x2‖`` (Eq. 6.12) or of ``‖f(x1) − f(x2)‖ / ‖x1 − x2‖`` — a *lower* bound, to compare
  with the upper bound (Table 6.9).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from modelward.core.modules import eval_mode, model_device
from modelward.errors import ConfigError
from modelward.robustness.gloro.net import GloroNet


@dataclass(frozen=True)
class Certification:
    """Per-point certification results at ``epsilon`` and their summary."""

    epsilon: float
    predictions: torch.Tensor  # underlying model's top-1 class
    certified: torch.Tensor  # bool: non-⊥
    set_size: torch.Tensor  # k* of the loosest certified top-k set (0 = rejected)
    correct: torch.Tensor  # bool: clean top-1 correct
    robust_correct: torch.Tensor  # bool: certified and label in the certified top-k* set

    @property
    def n(self) -> int:
        return int(self.predictions.numel())

    @property
    def clean_accuracy(self) -> float:
        return float(self.correct.float().mean())

    @property
    def vra(self) -> float:
        return float(self.robust_correct.float().mean())

    @property
    def rejection_rate(self) -> float:
        return 1.0 - float(self.certified.float().mean())

    def to_dict(self) -> dict[str, float]:
        cert = self.certified
        return {"epsilon": self.epsilon, "n": self.n, "clean_accuracy": self.clean_accuracy, "vra": self.vra,
                "rejection_rate": self.rejection_rate,
                "mean_set_size": float(self.set_size[cert].float().mean()) if cert.any() else 0.0}


@torch.no_grad()
def certify(net: GloroNet, x: torch.Tensor, y: torch.Tensor | None = None, epsilon: float | None = None,
            batch_size: int = 1024) -> Certification:
    """Certify every point of ``x`` at ``epsilon`` (default: ``net.epsilon``) with one forward pass per batch.

    Freezes the net first (converged / exact Lipschitz bound) if it is not frozen. Labels are optional: without
    them ``correct`` / ``robust_correct`` are all False and only the certified mask is meaningful.

    Args:
        net: the GloRo net.
        x: inputs, batch first.
        y: labels (optional).
        epsilon: the ℓ2 radius to certify (default: the net's training ε).
        batch_size: points per forward pass.

    Returns:
        :class:`Certification` (per-point ``certified`` mask and predictions; ``vra``, ``clean_accuracy``,
        ``rejection_rate``).

    Example:
        >>> from modelward.robustness.gloro import GloroNet, build_gloro_model
        >>> net = GloroNet(build_gloro_model("d(8)", (4,), 3, seed=0), (4,), epsilon=0.1)
        >>> c = certify(net, torch.rand(16, 4), torch.randint(3, (16,)))
        >>> 0.0 <= c.vra <= c.clean_accuracy
        True
    """
    if not isinstance(net, GloroNet):  # a plain nn.Module has no Lipschitz bound to certify with

        raise ConfigError(f"certify: expected a GloroNet, got {type(net).__name__}; wrap the model first: "
                          "GloroNet(model, input_shape, epsilon=...) (an nn.Sequential of layers the bound covers), "
                          "or train one with `modelward robust train` (examples/robust_gloro.toml)")
    with eval_mode(net):
        if not net.frozen:
            net.freeze()
        old_eps = net.epsilon
        if epsilon is not None:
            net.epsilon = float(epsilon)
        try:
            return _certify_batches(net, x, y, batch_size)
        finally:
            net.epsilon = old_eps


def _certify_batches(net: GloroNet, x: torch.Tensor, y: torch.Tensor | None, batch_size: int) -> Certification:
    """The certification pass of :func:`certify` (the net already in eval mode, ε set)."""
    K = net.frozen_K
    dev = K.device  # the model's device (freeze puts K there); batches go there, results come back
    preds, certs, sizes, ranks_y = [], [], [], []
    for i in range(0, len(x), batch_size):
        logits = net.f(x[i : i + batch_size].to(dev, non_blocking=True))
        mk = net.top_k_margins(logits, K)
        ok = mk > 0
        ks = torch.arange(1, mk.shape[1] + 1, device=dev).expand_as(mk)
        kstar = torch.where(ok, ks, torch.zeros_like(ks)).max(1).values
        preds.append(logits.argmax(1))
        certs.append(ok.any(1))
        sizes.append(kstar)
        if y is not None:
            rank = logits.argsort(1, descending=True).argsort(1)
            ranks_y.append(rank.gather(1, y[i : i + batch_size, None].to(dev)).squeeze(1))
    pred, cert, size = torch.cat(preds), torch.cat(certs), torch.cat(sizes)
    if y is None:
        correct = torch.zeros_like(cert)
        robust = torch.zeros_like(cert)
    else:
        correct = pred == y.to(dev)
        robust = cert & (torch.cat(ranks_y) < size)
    return Certification(net.epsilon, pred, cert, size, correct, robust)


@torch.no_grad()
def certified_radius(net: GloroNet, x: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
    """Per point, the ℓ2 radius up to which the top-1 prediction is certified (seed 002 §6.2, Eq. 6.3).

    With j the predicted class and K* the frozen pairwise margin Lipschitz bound, the radius is
    ``min_{i≠j} (f_j(x) − f_i(x)) / K*_ji``: :func:`certify` at ε certifies a point exactly when ε < its radius
    (standard GloRo, top-1; RTK / affinity sets certify more).

    Args:
        net: the GloRo net (frozen first if its bound is missing or stale).
        x: inputs, batch first.
        batch_size: points per forward pass.

    Returns:
        A float tensor of radii, one per point (``inf`` where no other class can catch up).

    Example:
        >>> from modelward.robustness.gloro import GloroNet, build_gloro_model
        >>> net = GloroNet(build_gloro_model("d(8)", (4,), 3, seed=0), (4,), epsilon=0.1)
        >>> certified_radius(net, torch.rand(5, 4)).shape
        torch.Size([5])
    """
    with eval_mode(net):
        K = net.lipschitz_constant()
        radii = []
        for i in range(0, len(x), batch_size):
            f = net.f(x[i : i + batch_size])
            j = f.argmax(1)
            r = (f.gather(1, j[:, None]) - f) / K[j].clamp_min(1e-30)
            r[torch.arange(len(f)), j] = float("inf")
            radii.append(r.min(1).values)
        return torch.cat(radii) if radii else torch.zeros(0)


def certified_mask(net: GloroNet, x: torch.Tensor, epsilon: float | None = None) -> torch.Tensor:
    """Label-free: True where the net's prediction is certified ε-robust."""
    return certify(net, x, None, epsilon).certified


def empirical_lipschitz(model: nn.Module, x: torch.Tensor, kind: Literal["margin", "logits"] = "margin",
                        n_pairs: int = 256, steps: int = 50, lr: float = 0.01, seed: int = 0) -> float:
    """Lower bound on the Lipschitz constant: max ratio over random pairs, then over pairs moved by gradient ascent.

    Pairs start as (x_a, x_a + δ) with small δ and as (x_a, x_b) for random data points; both ends are optimised
    with Adam to maximise the ratio (Eq. 6.12 for ``kind="margin"``). Every evaluated pair is a valid lower bound.
    """
    g = torch.Generator().manual_seed(seed)  # drawn on the CPU (the same pairs on every device), then moved
    dev = model_device(model)
    x = x.to(dev)
    n = len(x)
    a = x[torch.randint(n, (n_pairs,), generator=g).to(dev)]
    b = x[torch.randint(n, (n_pairs,), generator=g).to(dev)]
    half = n_pairs // 2
    b[:half] = a[:half] + 0.05 * torch.randn(a[:half].shape, generator=g).to(dev, a.dtype)
    x1 = a.clone().requires_grad_(True)
    x2 = b.clone().requires_grad_(True)
    best = 0.0
    opt = torch.optim.Adam([x1, x2], lr=lr)
    with eval_mode(model, frozen_params=True):
        with torch.no_grad():
            j = model(x1).argmax(1)
        for _ in range(steps + 1):
            f1, f2 = model(x1), model(x2)
            dist = (x1 - x2).flatten(1).norm(dim=1).clamp_min(1e-6)
            if kind == "margin":
                d1 = f1.gather(1, j[:, None]) - f1
                d2 = f2.gather(1, j[:, None]) - f2
                num = (d1 - d2).abs().max(1).values
            else:
                num = (f1 - f2).norm(dim=1)
            ratio = num / dist
            best = max(best, float(ratio.detach().max()))
            opt.zero_grad()
            (-ratio.sum()).backward()
            opt.step()
    return best
