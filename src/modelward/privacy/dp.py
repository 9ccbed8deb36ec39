"""Defenses (seed 002 App. C): DP-SGD through Opacus, dropout, and the advantage bound that ε implies.

DP-SGD (Abadi et al. 2016) via ``opacus.PrivacyEngine``: per-example clipping to ``max_grad_norm``, Gaussian noise
``noise_multiplier · max_grad_norm``, Poisson sampling with rate batch/N. The noise multiplier is either given or
found for a target (ε, δ) over the planned number of epochs (``opacus.accountants.utils.get_noise_multiplier``).
Every ε is reported with its accountant (``rdp`` = Rényi DP / moments accountant, the TF Privacy one the thesis
used; ``prv`` = PRV accountant; ``gdp`` = Gaussian DP) and δ (default 1/(10 N), so δ < 1/N as in App. C).

Bound check: an (ε, δ)-DP learner limits membership advantage to (1 − δ)(e^ε − 1)/(e^ε + 1) + δ (hypothesis-
testing form, tight) and, as App. C states for pure ε, to e^ε − 1 (Yeom et al.); see
:func:`modelward.privacy.metrics.dp_advantage_bounds`. :func:`check_advantage` compares a measured advantage with
the (ε, δ) bound, with a 95 % binomial interval on the measurement.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from modelward.core.config import StrictModel
from modelward.errors import ConfigError
from modelward.privacy.metrics import dp_advantage_bounds

Accountant = Literal["rdp", "prv", "gdp"]


def _opacus() -> object:
    try:
        import opacus
    except ImportError:  # pragma: no cover - opacus is in the `privacy` extra
        raise ConfigError("DP-SGD needs Opacus: pip install 'modelward[privacy]'") from None
    return opacus


class DPConfig(StrictModel):
    """DP-SGD hyper-parameters. Give ``target_epsilon`` (noise found for it) or ``noise_multiplier``.

    Args:
        target_epsilon: the ε to reach after ``epochs`` (Opacus finds the noise multiplier).
        noise_multiplier: an explicit noise multiplier σ instead.
        delta: δ (None: 1 / (10 N)).
        max_grad_norm: per-example gradient clipping norm C.
        accountant: the privacy accountant named next to every ε (``"rdp"`` default).
        epochs / batch_size: the training length and the expected batch size (Poisson sampling).
        optimizer / lr / momentum: ``"sgd"`` or ``"adam"`` and its step size (momentum for SGD).

    Returns:
        A strict config for :func:`train_dp`.

    Example:
        >>> cfg = DPConfig(target_epsilon=1.0, epochs=5)
        >>> cfg.accountant, cfg.max_grad_norm
        ('rdp', 1.0)
    """

    target_epsilon: float | None = Field(None, gt=0.0)
    noise_multiplier: float | None = Field(None, ge=0.0)
    delta: float | None = Field(None, gt=0.0, lt=1.0)  # None: 1 / (10 N)
    max_grad_norm: float = Field(1.0, gt=0.0)
    accountant: Accountant = "rdp"
    epochs: int = Field(30, ge=1)
    batch_size: int = Field(32, ge=1)
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = Field(0.1, gt=0.0)
    momentum: float = Field(0.9, ge=0.0, lt=1.0)


@dataclass(frozen=True)
class DPReport:
    """What was spent: ε at δ under ``accountant``, with the noise, sampling rate and steps that produced it."""

    epsilon: float
    delta: float
    accountant: str
    noise_multiplier: float
    sample_rate: float
    steps: int
    max_grad_norm: float

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self)

    def text(self) -> str:
        return f"ε = {self.epsilon:.3g} at δ = {self.delta:.3g} ({self.accountant} accountant)"


def default_delta(n: int) -> float:
    return 1.0 / (10.0 * n)


def noise_for_epsilon(target_epsilon: float, delta: float, sample_rate: float, epochs: int,
                      accountant: Accountant = "rdp") -> float:
    """The smallest noise multiplier whose ``accountant`` ε after ``epochs`` at ``sample_rate`` is ≤ target."""
    _opacus()
    from opacus.accountants.utils import get_noise_multiplier

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(get_noise_multiplier(target_epsilon=target_epsilon, target_delta=delta,
                                          sample_rate=sample_rate, epochs=epochs, accountant=accountant))


def epsilon_spent(noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                  accountant: Accountant = "rdp") -> float:
    """ε of ``steps`` Poisson-sampled Gaussian steps under ``accountant`` (Opacus' own accounting)."""
    _opacus()
    from opacus.accountants import create_accountant

    acc = create_accountant(accountant)
    acc.history = [(noise_multiplier, sample_rate, steps)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(acc.get_epsilon(delta))


def train_dp(model: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: DPConfig, seed: int = 0) -> DPReport:
    """Train ``model`` in place with DP-SGD (Opacus) and return the privacy spent.

    Args:
        model: a model Opacus supports (Linear / Conv / norm layers without batch norm).
        x, y: the private training set; cfg: :class:`DPConfig`; seed: data order and noise seed.
    Returns:
        :class:`DPReport`; the model is left in eval mode with Opacus' hooks removed.
    Example:
        >>> rep = train_dp(net, x, y, DPConfig(target_epsilon=1.0, epochs=30))  # doctest: +SKIP
        >>> rep.text()    # 'ε = 0.998 at δ = 0.000351 (rdp accountant)'  # doctest: +SKIP
    """
    _opacus()
    from opacus import PrivacyEngine
    from opacus.validators import ModuleValidator

    if cfg.target_epsilon is None and cfg.noise_multiplier is None:
        raise ConfigError("dp: give target_epsilon (noise is found for it) or noise_multiplier")
    errors = ModuleValidator.validate(model, strict=False)
    if errors:
        raise ConfigError(f"dp: Opacus cannot train this model: {errors[0]} (batch norm → use batch_norm = false)")
    n = len(x)
    delta = cfg.delta if cfg.delta is not None else default_delta(n)
    batch = min(cfg.batch_size, n)
    sample_rate = 1.0 / math.ceil(n / batch)  # Opacus' rate: 1 / len(data loader)
    sigma = cfg.noise_multiplier if cfg.target_epsilon is None else noise_for_epsilon(
        cfg.target_epsilon, delta, sample_rate, cfg.epochs, cfg.accountant)
    g = torch.Generator().manual_seed(seed)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch, shuffle=True,
                                         generator=g)
    opt = (torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum) if cfg.optimizer == "sgd"
           else torch.optim.Adam(model.parameters(), lr=cfg.lr))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus warns that secure_mode (a CSPRNG) is off: we want seeded runs
        engine = PrivacyEngine(accountant=cfg.accountant)
        private, opt, loader = engine.make_private(module=model, optimizer=opt, data_loader=loader,
                                                   noise_multiplier=sigma, max_grad_norm=cfg.max_grad_norm,
                                                   poisson_sampling=True,
                                                   noise_generator=torch.Generator().manual_seed(seed + 1))
        private.train()
        steps = 0
        for _ in range(cfg.epochs):
            for xb, yb in loader:
                if len(xb) == 0:  # Poisson sampling drew an empty batch (rare); no update, not accounted
                    continue
                loss = F.cross_entropy(private(xb), yb)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        eps = float(engine.get_epsilon(delta))
        steps = sum(h[2] for h in engine.accountant.history)
    private.remove_hooks()
    for p in model.parameters():
        for attr in ("grad_sample", "_forward_counter"):
            if hasattr(p, attr):
                delattr(p, attr)
    model.eval()
    return DPReport(eps, delta, cfg.accountant, float(sigma), sample_rate, steps, cfg.max_grad_norm)


def add_dropout(model: nn.Module, p: float = 0.5) -> nn.Module:
    """Dropout on the input of every linear / conv layer after the first (App. C's dropout defense), as forward
    pre-hooks: parameter names and checkpoints are unchanged and eval mode switches it off."""
    if not 0 <= p < 1:
        raise ConfigError(f"dropout must lie in [0, 1), got {p}")
    layers = [m for m in model.modules() if isinstance(m, nn.Linear | nn.Conv2d | nn.Conv1d)]

    def hook(m: nn.Module, args: tuple) -> tuple:
        return (F.dropout(args[0], p, m.training), *args[1:])

    for m in layers[1:]:
        m.register_forward_pre_hook(hook)
    return model


def check_advantage(advantage: float, n_eval: int, epsilon: float, delta: float) -> dict[str, float | bool | str]:
    """Is a measured advantage within what (ε, δ)-DP allows? Reports both bounds and a 95 % interval.

    The advantage is 2·accuracy − 1 on ``n_eval`` balanced points; its normal-approximation 95 % half-width is
    2·1.96·sqrt(a(1 − a)/n). ``within`` compares the point estimate with the (ε, δ) bound; ``violation`` is True
    only if even the lower end of the interval exceeds it (a real contradiction, e.g. an accounting bug).
    """
    b = dp_advantage_bounds(epsilon, delta)
    acc = 0.5 + advantage / 2
    half = 2 * 1.96 * math.sqrt(max(acc * (1 - acc), 1e-12) / max(n_eval, 1))
    return {"advantage": advantage, "ci_low": advantage - half, "ci_high": advantage + half,
            "bound_eps_delta": b["hypothesis_test"], "bound_yeom": b["yeom"],
            "within": advantage <= b["hypothesis_test"], "violation": advantage - half > b["hypothesis_test"],
            "form": "adv ≤ (1−δ)(e^ε−1)/(e^ε+1) + δ (hypothesis-testing (ε,δ) form); Yeom: e^ε − 1"}
