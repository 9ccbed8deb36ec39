"""The input owner's defence against input reconstruction: perturb or decorrelate the activation it sends.

The first party (Alice) sends the next party (Bob) ``h = f_A(x)`` for every row of every pass. An honest-but-curious
Bob can train a decoder that maps ``h`` back to ``x`` (He et al. 2019, "Model inversion attacks against
collaborative inference", ACSAC; Erdogan et al. 2022, "UnSplit", WPES), and a hostile Bob can steer Alice's part
through his gradients until it is invertible (Pasquini et al. 2021, "Unleashing the tiger: inference attacks on
split learning", CCS). ``modelward split audit-leakage`` measures all three (``governance.leakage.inversion``).
Alice has two knobs, both off by default (each costs accuracy: measure it on your own model first):

- ``noise`` (σ): Gaussian noise added to every activation row she sends, ``h'_i = h_i + σ · rms(h_i) · n_i``,
  ``n_i ~ N(0, I)``: a fixed signal-to-noise ratio 1/σ whatever her weights become (an absolute scale could be
  out-grown by training). Each row's noise is keyed by Alice's secret and the row's *content* (HMAC-SHA256 of its
  bytes), so the same input always gets the same noise — across epochs, across an aborted and re-run step, across
  evaluation and prediction — and Bob cannot average fresh samples away, while two different inputs get
  independent noise (nothing to subtract). Her own update uses the gradient Bob computed at the noisy activation,
  back-propagated through her exact one (a straight-through estimator, as for compression).
- ``nopeek`` (α): distance correlation between the batch's inputs and activations added to her training loss,
  ``L_A = L + α · dCor(x, h)`` (Vepakomma et al. 2020, "NoPeek: information leakage reduction to share activations
  in distributed deep learning", ICDMW; dCor is Székely et al. 2007's sample distance correlation). dCor depends on
  her parameters only through ``h``, so it enters as an extra term on the gradient she receives:
  ``g ← g + α ∇_h dCor(x, h)``, computed when she sends ``h`` and added when ``g`` comes back (also in the
  bounded-staleness path, where the two are steps apart).

Example:
    >>> p = InputProtection(InputProtectionConfig(noise=0.5, nopeek=0.1, seed=0))
    >>> x = torch.rand(8, 1, 8, 8); h = torch.rand(8, 16, 4, 4)
    >>> sent = p.outgoing(h, x, step=3)
    >>> torch.equal(sent, p.outgoing(h, x, step=3)), bool((sent != h).any())
    (True, True)
    >>> p.incoming(torch.zeros_like(h), step=3).abs().sum() > 0
    tensor(True)
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import OrderedDict

import torch
from pydantic import Field

from modelward.core.config import StrictModel
from modelward.errors import ConfigError

KEEP_STEPS = 8  # NoPeek terms kept for steps whose gradient has not come back yet (bounded staleness keeps <= 3)


class InputProtectionConfig(StrictModel):
    """``[input_protection]`` (the first party only): how Alice perturbs what she sends.

    Args:
        noise: σ, the noise's standard deviation relative to each row's RMS (0 = off).
        nopeek: α, the weight of dCor(x, h) in Alice's loss (0 = off).
        seed: experiments only: derive the noise key from it (anyone who knows it can subtract the noise).
    """

    noise: float = Field(0.0, ge=0.0, le=1e3)
    nopeek: float = Field(0.0, ge=0.0, le=1e3)
    seed: int | None = None

    @property
    def active(self) -> bool:
        return self.noise > 0 or self.nopeek > 0


def distance_correlation(x: torch.Tensor, z: torch.Tensor, eps: float = 1e-9) -> torch.Tensor:
    """Sample distance correlation dCor(x, z) of two batches (rows are samples; Székely, Rizzo & Bakirov 2007,
    "Measuring and testing dependence by correlation of distances", Ann. Statist., Def. 4 with the V-statistics):
    0 when independent, 1 for a similarity transform. Differentiable (the NoPeek loss).

    Args:
        x: ``[n, ...]``; z: ``[n, ...]`` (flattened per row).
        eps: keeps the square roots differentiable at 0.

    Returns:
        A scalar tensor in [0, 1].
    """
    def centred(t: torch.Tensor) -> torch.Tensor:
        t = t.reshape(t.shape[0], -1)
        d = ((t[:, None, :] - t[None, :, :]) ** 2).sum(-1).add(eps).sqrt()
        return d - d.mean(0, keepdim=True) - d.mean(1, keepdim=True) + d.mean()

    a, b = centred(x.double()), centred(z.double())
    dcov_xz, dvar_x, dvar_z = (a * b).mean(), (a * a).mean(), (b * b).mean()
    return (dcov_xz.clamp_min(0) / (dvar_x * dvar_z).sqrt().add(eps)).add(eps).sqrt().to(z.dtype)


class InputProtection:
    """Alice's ``[input_protection]`` at work: :meth:`outgoing` on every activation she sends, :meth:`incoming`
    on every gradient of a training step she receives (see the module docstring).

    Args:
        config: the settings.

    Returns:
        The protection; ``active`` is False when both knobs are 0 (the party then sends exactly ``h``).
    """

    def __init__(self, config: InputProtectionConfig) -> None:
        self.config = config
        self.active = config.active
        self._key = (hashlib.sha256(f"modelward-input-noise:{config.seed}".encode()).digest()
                     if config.seed is not None else secrets.token_bytes(32))
        self._extra: OrderedDict[int, torch.Tensor] = OrderedDict()

    def noise_for(self, x: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """Standard normal noise of `shape` (``[rows, ...]``), each row keyed by the secret and the bytes of the
        row of `x` it belongs to."""
        rows = x.detach().reshape(x.shape[0], -1).contiguous().cpu()
        out = torch.empty(shape, dtype=torch.float32)
        flat = out.view(shape[0], -1)
        gen = torch.Generator()
        for i in range(shape[0]):
            digest = hmac.new(self._key, rows[i].numpy().tobytes(), hashlib.sha256).digest()
            gen.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
            flat[i] = torch.randn(flat.shape[1], generator=gen)
        return out

    def outgoing(self, h: torch.Tensor, x: torch.Tensor, step: int | None = None) -> torch.Tensor:
        """What Alice sends for activation `h` of inputs `x` (``h`` itself when nothing is active).

        Args:
            h: her segment's output ``[rows, ...]`` (detached here).
            x: the rows' inputs (keys the noise; the NoPeek term's first argument).
            step: the training step (its NoPeek term is kept for :meth:`incoming`); None for evaluation and
                prediction (noise only).
        """
        h = h.detach()
        if not self.active:
            return h
        if step is not None and self.config.nopeek > 0:
            hh = h.clone().requires_grad_(True)
            with torch.enable_grad():
                (grad,) = torch.autograd.grad(distance_correlation(x.detach(), hh), hh)
            self._extra[int(step)] = self.config.nopeek * grad
            self._extra.move_to_end(int(step))
            while len(self._extra) > KEEP_STEPS:
                self._extra.popitem(last=False)
        if self.config.noise <= 0:
            return h
        rms = h.reshape(h.shape[0], -1).pow(2).mean(1).sqrt()
        noise = self.noise_for(x, tuple(h.shape)).to(h.device, h.dtype)
        scale = (self.config.noise * rms).reshape(-1, *([1] * (h.dim() - 1)))
        return (h + scale * noise).contiguous(memory_format=_format_of(h))

    def incoming(self, g: torch.Tensor, step: int) -> torch.Tensor:
        """The gradient Alice back-propagates for training step `step`: Bob's `g`, plus her NoPeek term."""
        extra = self._extra.pop(int(step), None)
        if extra is None:
            return g
        return (g + extra.to(g.dtype)).contiguous(memory_format=_format_of(g))


def _format_of(t: torch.Tensor) -> torch.memory_format:
    """The memory format `t` travels in (channels-last image activations stay channels-last)."""
    if t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def input_protection(config: InputProtectionConfig, name: str, is_first: bool) -> InputProtection | None:
    """The party's protection, or None when it has none (the party then sends its exact activation).

    Raises:
        ConfigError: ``[input_protection]`` on a party that is not the first (only the first holds inputs).
    """
    if not config.active:
        return None
    if not is_first:
        raise ConfigError(f"party {name}: input_protection: only the first party (the inputs' owner) protects its "
                          "activations; remove [input_protection] here")
    return InputProtection(config)


def protected(inputs: InputProtection | None, out: torch.Tensor, x: torch.Tensor, step: int | None = None
              ) -> torch.Tensor:
    """The activation that leaves the first party for the next: through its input protection, if any.

    Args:
        inputs: the party's :class:`InputProtection` (None: the exact activation leaves).
        out: the party's output; x: its input rows; step: the training step (None: an evaluation or prediction).

    Returns:
        The tensor to send (detached from the party's graph).
    """
    return out.detach() if inputs is None else inputs.outgoing(out, x, step)
