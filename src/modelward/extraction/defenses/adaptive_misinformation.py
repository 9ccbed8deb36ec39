"""Adaptive Misinformation (Kariyappa & Qureshi; ModelGuard paper App. B.2).

ŷ = (1 − α) y + α f̂(x),  α = 1 / (1 + exp(ν (y_max − τ))),

so queries the victim is unsure about (likely out of distribution: max probability below τ) are answered by a
*misinformation model* f̂ trained to put low probability on the true class (loss −log(1 − f̂(x)_y), the official
``train_admis.py``, trained on the defender's own training data). Top-1 is not preserved and there is no ℓ1 bound
(the paper measures ℓ1 up to ≈ 2). The official code's OE-trained target (App. B.3) is the harness's job.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from modelward.errors import ConfigError
from modelward.extraction.defenses.base import PredictionDefense


class AdaptiveMisinformation(PredictionDefense):
    """AM with threshold ``tau``, sharpness ``nu`` (paper: 1000) and a ``misinformation`` model (logits).

    Adaptive misinformation (Kariyappa & Qureshi 2020): confident queries (max y > τ) get y, others are mixed
    towards the misinformation model's answer, ``ŷ = (1 − α) y + α ŷ_mis`` with ``α = sigmoid(−ν (max y − τ))``.

    Args:
        tau: confidence threshold τ in [0, 1].
        nu: sharpness ν of the switch (paper: 1000).
        misinformation: the misinformation model f̂ (returns logits; see ``train_misinformation_model``); required.

    Returns:
        ``defense.defend(probs)`` (``probs``: a B × K batch of probability vectors) returns the perturbed vectors,
        B × K on the simplex; ``x=`` passes the queried inputs to defenses that need them. AdaptiveMisinformation needs ``x``.

    Example:
        >>> import torch
        >>> mis = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
        >>> x, y = torch.rand(2, 4), torch.tensor([[0.9, 0.05, 0.05], [0.4, 0.35, 0.25]])
        >>> out = AdaptiveMisinformation(tau=0.5, misinformation=mis).defend(y, x=x)
        >>> torch.allclose(out[0], y[0])  # confident: answered truthfully
        True
    """

    name = "adaptive_misinformation"
    needs = ("misinformation",)
    preserves_top1 = False
    epsilon = None
    needs_inputs = True

    def __init__(self, tau: float = 0.5, nu: float = 1000.0, misinformation: nn.Module | None = None) -> None:
        if misinformation is None or not isinstance(misinformation, nn.Module):
            raise ConfigError("defense adaptive_misinformation: needs misinformation=<nn.Module> (see "
                              "train_misinformation_model), e.g. make_defense('adaptive_misinformation', tau=0.5, "
                              "misinformation=model)")
        if not 0.0 <= tau <= 1.0:
            raise ConfigError(f"defense adaptive_misinformation: tau must be in [0, 1], got {tau!r}")
        if not nu > 0:
            raise ConfigError(f"defense adaptive_misinformation: nu must be > 0, got {nu!r}")
        self.tau, self.nu = float(tau), float(nu)
        self.misinformation = misinformation.eval()

    def alpha(self, y: Tensor) -> Tensor:
        """Per-row mixing weight α (≈ 1 below τ, ≈ 0 above)."""
        return torch.sigmoid(-self.nu * (y.max(1).values - self.tau))

    @torch.no_grad()
    def _defend(self, y: Tensor, x: Tensor | None) -> Tensor:
        assert x is not None
        mis = torch.softmax(self.misinformation(x).to(torch.float64), dim=1)
        if mis.shape != y.shape:
            raise ConfigError(f"defense adaptive_misinformation: misinformation model returns {mis.shape[1]} "
                              f"classes, the victim {y.shape[1]}")
        a = self.alpha(y)[:, None]
        return (1.0 - a) * y + a * mis

    def params(self) -> dict[str, float | int | str | bool | None]:
        return {"tau": self.tau, "nu": self.nu}


def misinformation_loss(logits: Tensor, y: Tensor) -> Tensor:
    """Mean −log(1 − softmax(logits)_y + 1e-7) (the official reverse cross-entropy)."""
    p = torch.softmax(logits, dim=1).gather(1, y[:, None])[:, 0]
    return -torch.log(1.0 - p + 1e-7).mean()


def train_misinformation_model(model: nn.Module, x: Tensor, y: Tensor, steps: int = 300, lr: float = 0.05,
                               batch_size: int = 64, seed: int = 0, momentum: float = 0.9) -> nn.Module:
    """Train ``model`` (fresh, the victim's architecture) in place as AM's misinformation model f̂ on (x, y).

    The one recipe (the official ``train_admis``): SGD with momentum, minibatches of `batch_size` drawn with
    replacement from a generator seeded with `seed`, loss :func:`misinformation_loss` = −log(1 − f̂(x)_y + 1e-7).

    Args:
        model: the network to train (returns logits); left in eval mode.
        x, y: the defender's training inputs and labels.
        steps, lr, batch_size, seed, momentum: the schedule.

    Returns:
        `model`.

    Example:
        >>> net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
        >>> x, y = torch.rand(32, 4), torch.randint(3, (32,))
        >>> mis = train_misinformation_model(net, x, y, steps=5, batch_size=8)
        >>> defense = AdaptiveMisinformation(tau=0.5, misinformation=mis)
    """
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    model.train()
    for _ in range(steps):
        idx = torch.randint(0, len(x), (min(batch_size, len(x)),), generator=g)
        loss = misinformation_loss(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return model.eval()
