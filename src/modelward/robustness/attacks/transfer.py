"""Black-box transfer attack through a proxy model (seed 004 §2.1, eq 2.7; Papernot et al. 2017).

The attacker only sees the victim's answers (arg-max labels): it queries the victim on ``x_query`` (default: the
inputs it wants to attack), trains a proxy ``f'`` with ``argmin ℓ(f(x), f'(x))``, runs a white-box attack (PGD by
default) on the proxy, and submits the result to the victim, relying on transferability. ``self.model`` is the
victim and is used only through ``predict`` (labels); success is judged on the victim.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from modelward.core.device import model_device
from modelward.core.seed import seeded
from modelward.core.train import TrainConfig, train
from modelward.core.zoo import ModelConfig, build_model
from modelward.robustness.attacks import make_attack
from modelward.robustness.attacks.base import EvasionAttack, Norm, attack_mode, predict


class TransferAttack(EvasionAttack):
    """Black-box transfer attack through a proxy (Papernot et al. 2017; seed 004 eq 2.7).

    Queries the victim's labels on ``x_query`` (default: the points attacked), trains a proxy on them, runs a
    white-box attack (``attack``, default PGD) on the proxy and submits its result to the victim. The victim is used
    only through its arg-max labels; ``queries`` counts them.

    Args:
        model: the victim (only its predicted labels are used).
        eps: the budget ε of the white-box attack on the proxy.
        norm: ``"linf"`` or ``"l2"``.
        proxy: your own proxy model (default: a fresh MLP of ``proxy_hidden`` units, ``proxy_arch="mlp"``).
        proxy_arch: architecture of the default proxy (a :mod:`modelward.core.zoo` name).
        proxy_hidden: hidden units of the default proxy (default ``[128]``).
        proxy_steps: training steps of the proxy.
        x_query: the attacker's query inputs (default: the inputs attacked).
        attack: the white-box attack run on the proxy (a :data:`ATTACK_NAMES` name).
        attack_params: its extra parameters (e.g. ``{"steps": 10}``).
        clip: the input box ``(low, high)``; adversarial inputs never leave it.
        targeted: attack towards ``target`` (passed at call time) instead of away from ``y``.
        seed: seeds every random choice (a ``torch.Generator``; the global RNG is never touched).
        batch_size: attack this many points at a time (default: all at once).

    Returns:
        Calling the attack, ``attack(x, y)`` (targeted: ``attack(x, y, target)``), returns an
        :class:`~modelward.robustness.attacks.base.AttackResult` with ``x_adv`` (same shape as ``x``) and the bool
        ``success`` mask (untargeted: prediction differs from ``y``; targeted: equals the target).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
        >>> x, y = torch.rand(8, 1, 8, 8), torch.randint(10, (8,))
        >>> atk = TransferAttack(model, eps=0.1, proxy_steps=20, attack_params={"steps": 3})
        >>> res = atk(x, y)
        >>> atk.queries
        8
    """

    name = "transfer"
    norms = ("linf", "l2")

    def __init__(self, model: nn.Module, eps: float = 0.1, norm: Norm = "linf", proxy: nn.Module | None = None,
                 proxy_arch: str = "mlp", proxy_hidden: list[int] | None = None, proxy_steps: int = 600,
                 x_query: torch.Tensor | None = None, attack: str = "pgd",
                 attack_params: dict[str, Any] | None = None, clip: tuple[float, float] = (0.0, 1.0),
                 targeted: bool = False, seed: int = 0, batch_size: int | None = None) -> None:
        super().__init__(model, eps, norm, clip, targeted, seed, batch_size)
        self.proxy = proxy
        self.proxy_arch, self.proxy_hidden, self.proxy_steps = proxy_arch, proxy_hidden or [128], proxy_steps
        self.x_query = x_query
        self.attack_name = attack
        self.attack_params = dict(attack_params or {})
        self.queries = 0
        self._fitted = False

    def fit_proxy(self, x_query: torch.Tensor) -> nn.Module:
        """Label ``x_query`` with the victim (black-box queries) and train the proxy on those answers (eq 2.7)."""
        with attack_mode(self.model):
            labels = predict(self.model, x_query)
        self.queries += len(x_query)
        num_classes = int(self.model(x_query[:1]).shape[1]) if len(x_query) else 2
        if self.proxy is None:
            cfg = ModelConfig(arch=self.proxy_arch, hidden=self.proxy_hidden)  # type: ignore[arg-type]
            with seeded(self.seed):  # the base class's contract: the attack's randomness depends on seed only
                self.proxy = build_model(cfg, tuple(x_query.shape[1:]), num_classes)
            self.proxy.to(model_device(self.model))  # initialised on the CPU, trained beside the victim
        tcfg = TrainConfig(optimizer="adam", lr=1e-3, weight_decay=0.0, steps=self.proxy_steps,
                           batch_size=min(64, len(x_query)), eval_every=self.proxy_steps)
        with seeded(self.seed):  # ... and leaves the caller's global RNG untouched
            train(self.proxy, x_query, labels, x_query, labels, tcfg, self.seed)
        self._fitted = True
        return self.proxy

    def proxy_agreement(self, x: torch.Tensor) -> float:
        """Fraction of ``x`` on which proxy and victim give the same label."""
        if self.proxy is None:
            return 0.0
        with attack_mode(self.model), attack_mode(self.proxy):
            return float((predict(self.model, x) == predict(self.proxy, x)).float().mean())

    def perturb(self, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None,
                gen: torch.Generator) -> torch.Tensor:
        if not self._fitted:
            self.fit_proxy(self.x_query if self.x_query is not None else x)
        assert self.proxy is not None
        params = {"eps": self.eps, "clip": self.clip, "seed": self.seed, **self.attack_params}
        if self.norm != "linf" or "norm" in params:
            params.setdefault("norm", self.norm)
        if self.targeted:
            params["targeted"] = True
        white = make_attack(self.attack_name, self.proxy, **params)
        return white(x, y, target).x_adv if target is not None else white(x, y).x_adv
