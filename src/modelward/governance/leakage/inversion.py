"""Input reconstruction by the next party: what Bob learns about Alice's private inputs from her activations.

In split learning the next party (Bob) receives ``h = f_A(x)`` for every row Alice sends. He knows the agreed
architecture of Alice's part (not her weights), holds his own part ``f_B`` (trained on ``h``) and, as in the
literature, an *auxiliary* data set from the same distribution (here: a public part of the data set, disjoint from
Alice's rows). Three attacks, each one function:

- :func:`decoder_attack`, honest-but-curious and query-free (He et al. 2019, "Model inversion attacks against
  collaborative inference", ACSAC, §V "query-free attack"): Bob trains a *surrogate* ``f̃_A`` of Alice's part such
  that his own (frozen) part classifies the auxiliary data through it — his part only understands Alice's feature
  space, so the surrogate is pushed into it — and whose features match the first two moments of the activations he
  received; then a decoder ``D: f̃_A(x) → x`` on the auxiliary data, applied to what Alice sent. Under Alice's
  activation noise Bob trains ``D`` on equally noisy features (an adaptive attacker who knows σ).
- :func:`unsplit_attack`, honest-but-curious, no auxiliary data (Erdogan et al. 2022, "UnSplit: data-oblivious
  model inversion, model stealing, and label inference attacks against split learning", WPES, Alg. 1): jointly
  optimise the unknown inputs ``x̂`` and a surrogate ``f̃_A`` to reproduce the received activations,
  ``min ||f̃_A(x̂) − h||² + λ·TV(x̂)``, alternating between the two.
- :class:`FSHAServer`, training hijacking (Pasquini et al. 2021, "Unleashing the tiger: inference attacks on split
  learning", CCS, §3 Alg. 1): Bob never trains the task. He trains a pilot encoder ``f̃`` and its decoder ``f̃⁻¹``
  as an auto-encoder on auxiliary data and a Wasserstein critic ``D`` (gradient penalty, Gulrajani et al. 2017)
  between ``f̃(x_aux)`` and Alice's activations, and returns Alice the gradient of ``−D(h)``: her part is trained to
  map into the pilot's feature space, where ``f̃⁻¹`` inverts it.

:func:`reconstruction_scores` scores a reconstruction (per-row SSIM for images, MSE per feature for everything)
and :func:`baselines` the no-leak references: the auxiliary mean (what Bob knows without any activation) and the
attack's own reconstructions scored against *other* rows (what "looks like a typical input" earns without any
row-specific information).

Example:
    >>> x_hat = decoder_attack(alice_like, bob_part, aux_x, aux_y, received_h, images=True)  # doctest: +SKIP
    >>> reconstruction_scores(private_x, x_hat, images=True)["ssim"]  # doctest: +SKIP
    0.62
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from modelward.core.seed import seeded
from modelward.core.similarity import ssim

Builder = Callable[[], nn.Module]  # a fresh, randomly initialised module of Alice's architecture


def reconstruction_scores(x: torch.Tensor, x_hat: torch.Tensor, images: bool,
                          data_range: float = 1.0) -> dict[str, float]:
    """How close `x_hat` is to `x`, row by row.

    Args:
        x: the true inputs ``[n, ...]``; x_hat: the reconstructions (same shape).
        images: also report SSIM (``x`` are images ``[n, C, H, W]``).
        data_range: the images' value range (SSIM's constants).

    Returns:
        ``mse`` (mean squared error per feature, averaged over rows) and, for images, ``ssim`` (mean over rows).
    """
    x, x_hat = x.detach().float(), x_hat.detach().float().reshape(x.shape)
    out = {"mse": float(((x - x_hat) ** 2).mean())}
    if images:
        out["ssim"] = float(ssim(x, x_hat.clamp(0.0, data_range) if data_range else x_hat,
                                 data_range=data_range).mean())
    return out


def baselines(x: torch.Tensor, aux_x: torch.Tensor, x_hat: torch.Tensor, images: bool, data_range: float = 1.0,
              seed: int = 0) -> dict[str, float]:
    """The no-leak references for a reconstruction `x_hat` of `x`.

    Returns:
        ``mean_mse`` / ``mean_ssim``: the auxiliary mean input as every row's reconstruction (what Bob has without
        any activation); ``other_mse`` / ``other_ssim``: `x_hat` scored against a random *other* row (a derangement
        of the rows): what an output that merely looks like a typical input earns.
    """
    mean = aux_x.float().mean(0, keepdim=True).expand_as(x)
    m = reconstruction_scores(x, mean, images, data_range)
    g = torch.Generator().manual_seed(seed)
    n = x.shape[0]
    perm = (torch.arange(n) + 1 + torch.randint(0, max(n - 1, 1), (n,), generator=g)) % n  # never itself
    o = reconstruction_scores(x, x_hat.reshape(x.shape)[perm], images, data_range)
    out = {"mean_mse": m["mse"], "other_mse": o["mse"]}
    if images:
        out |= {"mean_ssim": m["ssim"], "other_ssim": o["ssim"]}
    return out


class Decoder(nn.Module):
    """An MLP from a flattened activation to the input (sigmoid output for images in [0, 1])."""

    def __init__(self, h_dim: int, x_shape: tuple[int, ...], hidden: int = 512, images: bool = True) -> None:
        super().__init__()
        self.x_shape, self.images = x_shape, images
        x_dim = int(torch.tensor(x_shape).prod())
        self.net = nn.Sequential(nn.Linear(h_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, x_dim))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out = self.net(h.reshape(h.shape[0], -1))
        return (torch.sigmoid(out) if self.images else out).reshape(h.shape[0], *self.x_shape)


def _noisy(h: torch.Tensor, sigma: float, gen: torch.Generator) -> torch.Tensor:
    """Alice's activation noise as Bob imitates it: σ · the row's RMS · N(0, I) (he knows σ, not her key)."""
    if sigma <= 0:
        return h
    rms = h.reshape(h.shape[0], -1).pow(2).mean(1).sqrt().reshape(-1, *([1] * (h.dim() - 1)))
    return h + sigma * rms * torch.randn(h.shape, generator=gen)


def _batches(n: int, size: int, gen: torch.Generator):
    while True:
        perm = torch.randperm(n, generator=gen)
        for i in range(0, n - size + 1, size):
            yield perm[i:i + size]


def decoder_attack(builder: Builder, bob: nn.Module, aux_x: torch.Tensor, aux_y: torch.Tensor,
                   received: torch.Tensor, images: bool, *, surrogate_steps: int = 1500, decoder_steps: int = 1500,
                   batch: int = 64, moments: float = 1.0, sigma: float = 0.0, seed: int = 0) -> torch.Tensor:
    """He et al.'s query-free attack with a decoder (see the module docstring).

    Args:
        builder: a fresh module of Alice's architecture (Bob knows the agreed model, not her weights).
        bob: Bob's trained part (kept frozen, evaluation mode).
        aux_x, aux_y: the auxiliary data set (inputs and labels; disjoint from Alice's rows).
        received: the activations Bob received for the rows to reconstruct ``[n, ...]``.
        images: the inputs are images in [0, 1] (the decoder ends in a sigmoid).
        surrogate_steps / decoder_steps: Adam steps of each phase; batch: their batch size.
        moments: weight of the moment-matching term (per-feature mean and standard deviation of the surrogate's
            features against the received activations', in units of the latter's spread).
        sigma: Alice's activation-noise σ, imitated on the surrogate's features when training the decoder.
        seed: the attack's randomness.

    Returns:
        The reconstructions ``[n, *input shape]``.
    """
    gen = torch.Generator().manual_seed(seed)
    with seeded(seed):  # the modules' initialisation (global RNG), restored afterwards
        sur = builder()
    bob = bob.eval()
    for p in bob.parameters():
        p.requires_grad_(False)
    flat = received.detach().reshape(received.shape[0], -1).float()
    mu, sd = flat.mean(0), flat.std(0)
    spread = sd.mean().clamp_min(1e-6)
    opt = torch.optim.Adam(sur.parameters(), lr=1e-3)
    it = _batches(len(aux_x), min(batch, len(aux_x)), gen)
    sur.train()
    for _ in range(surrogate_steps):
        i = next(it)
        f = sur(aux_x[i])
        loss = F.cross_entropy(bob(_noisy(f, sigma, gen)), aux_y[i])
        if moments > 0:
            ff = f.reshape(f.shape[0], -1)
            loss = loss + moments * (((ff.mean(0) - mu) ** 2).mean() + ((ff.std(0) - sd) ** 2).mean()) / spread ** 2
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    for p in sur.parameters():
        p.requires_grad_(False)
    with seeded(seed + 1):
        dec = Decoder(flat.shape[1], tuple(aux_x.shape[1:]), images=images)
    opt = torch.optim.Adam(dec.parameters(), lr=1e-3)
    for _ in range(decoder_steps):
        i = next(it)
        with torch.no_grad():
            f = _noisy(sur(aux_x[i]), sigma, gen)
        loss = F.mse_loss(dec(f), aux_x[i])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    with torch.no_grad():
        return dec.eval()(received.float())


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Anisotropic total variation of image rows ``[n, C, H, W]`` (0 for anything that is not an image)."""
    if x.dim() != 4:
        return x.new_zeros(())
    return (x[..., 1:, :] - x[..., :-1, :]).abs().mean() + (x[..., :, 1:] - x[..., :, :-1]).abs().mean()


def unsplit_attack(builder: Builder, received: torch.Tensor, start: torch.Tensor, images: bool, *,
                   rounds: int = 60, x_steps: int = 20, model_steps: int = 20, tv: float = 0.001,
                   lr_x: float = 0.01, lr_model: float = 1e-3, seed: int = 0) -> torch.Tensor:
    """UnSplit (Erdogan et al. 2022, Alg. 1): alternate Adam steps on the unknown inputs and on a surrogate of
    Alice's part so that the surrogate maps the inputs onto the received activations.

    Args:
        builder: a fresh module of Alice's architecture.
        received: the activations to invert ``[n, ...]`` (one batch: they share Alice's part).
        start: the inputs' starting point (broadcast to ``[n, ...]``; e.g. the auxiliary mean, or a constant).
        images: keep ``x̂`` in [0, 1] and regularise it by total variation.
        rounds / x_steps / model_steps: the alternation (UnSplit's outer loop and its two inner loops).
        tv: the total-variation weight λ; lr_x / lr_model: Adam's step sizes.
        seed: the surrogate's initialisation.

    Returns:
        The reconstructions ``x̂`` ``[n, *input shape]``.
    """
    with seeded(seed):  # the surrogate's initialisation (global RNG), restored afterwards
        sur = builder().train()
    target = received.detach().float()
    x_hat = start.detach().float().expand(target.shape[0], *start.shape[1:]).clone().requires_grad_(True)
    opt_x = torch.optim.Adam([x_hat], lr=lr_x)
    opt_m = torch.optim.Adam(sur.parameters(), lr=lr_model)

    def loss_of() -> torch.Tensor:
        out = F.mse_loss(sur(x_hat), target)
        return out + tv * total_variation(x_hat) if images else out

    for _ in range(rounds):
        for _ in range(x_steps):
            opt_x.zero_grad(set_to_none=True)
            loss_of().backward()
            opt_x.step()
            if images:
                with torch.no_grad():
                    x_hat.clamp_(0.0, 1.0)
        for _ in range(model_steps):
            opt_m.zero_grad(set_to_none=True)
            loss_of().backward()
            opt_m.step()
    return x_hat.detach()


@dataclass
class FSHASettings:
    """FSHA's knobs (Pasquini et al. 2021, App. A uses Adam and WGAN-GP; sizes scaled to these small models)."""

    lr_autoencoder: float = 1e-3
    lr_critic: float = 1e-4
    gradient_penalty: float = 10.0
    critic_hidden: int = 256
    critic_steps: int = 1  # critic updates per step (on the same activations)
    grad_scale: float = 1.0  # Bob's factor on the gradient he returns (he chooses Alice's effective step size)


class FSHAServer:
    """Bob as a training hijacker (FSHA): per step he answers Alice's activations with the gradient of
    ``−D(h)`` while training the pilot auto-encoder and the critic on auxiliary data (see the module docstring).

    Args:
        builder: a fresh module of Alice's architecture (the pilot ``f̃`` has the same one, so Alice's part can
            reach the pilot's feature space).
        aux_x: the auxiliary inputs.
        h_shape: the shape of one activation row.
        images: the inputs are images in [0, 1].
        settings: learning rates and the gradient-penalty weight.
        seed: the attacker's randomness.

    Example:
        >>> bob = FSHAServer(builder, aux_x, (16, 4, 4), images=True)  # doctest: +SKIP
        >>> g = bob.step(h_received)  # the gradient Alice receives  # doctest: +SKIP
        >>> x_hat = bob.reconstruct(h_received)  # doctest: +SKIP
    """

    def __init__(self, builder: Builder, aux_x: torch.Tensor, h_shape: tuple[int, ...], images: bool,
                 settings: FSHASettings | None = None, seed: int = 0, batch: int = 64) -> None:
        s = settings or FSHASettings()
        self.settings = s
        self.gen = torch.Generator().manual_seed(seed)
        h_dim = int(torch.tensor(h_shape).prod())
        with seeded(seed):  # the three modules' initialisation (global RNG), restored afterwards
            self.pilot = builder().train()
            self.decoder = Decoder(h_dim, tuple(aux_x.shape[1:]), images=images)
            self.critic = nn.Sequential(nn.Flatten(), nn.Linear(h_dim, s.critic_hidden), nn.LeakyReLU(0.2),
                                        nn.Linear(s.critic_hidden, s.critic_hidden), nn.LeakyReLU(0.2),
                                        nn.Linear(s.critic_hidden, 1))
        self.opt_ae = torch.optim.Adam([*self.pilot.parameters(), *self.decoder.parameters()], lr=s.lr_autoencoder)
        self.opt_d = torch.optim.Adam(self.critic.parameters(), lr=s.lr_critic, betas=(0.5, 0.9))
        self.aux_x = aux_x
        self._it = _batches(len(aux_x), min(batch, len(aux_x)), self.gen)

    def step(self, h: torch.Tensor) -> torch.Tensor:
        """One training step of the hijacker on Alice's activations `h` (as received); returns the gradient he
        sends back (same shape as `h`)."""
        xa = self.aux_x[next(self._it)]
        # the pilot auto-encoder on the auxiliary data
        z = self.pilot(xa)
        loss_ae = F.mse_loss(self.decoder(z), xa)
        self.opt_ae.zero_grad(set_to_none=True)
        loss_ae.backward()
        self.opt_ae.step()
        # the critic: the pilot's features are "real", Alice's "fake" (WGAN-GP)
        real, fake = z.detach(), h.detach().float()
        n = min(len(real), len(fake))
        real, fake = real[:n], fake[:n]
        for _ in range(self.settings.critic_steps):
            eps = torch.rand((n,) + (1,) * (fake.dim() - 1), generator=self.gen)
            mix = (eps * real + (1 - eps) * fake).requires_grad_(True)
            (grad_mix,) = torch.autograd.grad(self.critic(mix).sum(), mix, create_graph=True)
            penalty = ((grad_mix.reshape(n, -1).norm(dim=1) - 1) ** 2).mean()
            gap = self.critic(real).mean() - self.critic(fake).mean()  # the critic's Wasserstein estimate
            loss_d = self.settings.gradient_penalty * penalty - gap
            self.opt_d.zero_grad(set_to_none=True)
            loss_d.backward()
            self.opt_d.step()
            self.distance = float(gap.detach())
        # Alice's "gradient": make her activations look like the pilot's
        hh = h.detach().float().requires_grad_(True)
        (g,) = torch.autograd.grad(-self.critic(hh).mean(), hh)
        return self.settings.grad_scale * g

    def reconstruct(self, h: torch.Tensor) -> torch.Tensor:
        """``f̃⁻¹(h)``: the hijacker's reconstruction of Alice's inputs from her activations."""
        with torch.no_grad():
            return self.decoder.eval()(h.float())
