"""Agent networks with named parts (seed 000 App. A, App. B Tables 5–7).

Torsos:
- ``atari``: the standard Atari architecture (Mnih et al. 2015/2016): conv1 8×8/4 (32), conv2 4×4/2 (64),
  conv3 3×3/1 (64), linear 512 — for 4×84×84 inputs.
- ``minatar``: the same 3 conv + 1 FC shape sized for 10×10 inputs: conv1 3×3/1 pad 1, conv2 3×3/2 pad 1 (10→5),
  conv3 3×3/1 pad 1, linear (default channels 16/32/32, linear 128).
- ``mlp``: vector observations (classic control): fc1, linear.
- ``resnet``: the IMPALA "deep" torso (Espeholt et al. 2018, Fig. 3): three sections ``s1``–``s3``, each a 3×3 conv
  (``sK.conv``, the part the paper resets as "SK Conv 1"), a 3×3/2 max-pool and two residual blocks
  (``sK.res1``, ``sK.res2``: ReLU → conv → ReLU → conv + skip); then ReLU, ``linear`` (default 256). Channels
  16/32/32 by default.
Heads: actor-critic ``policy`` and ``value``; DQN ``q`` or dueling ``value`` + ``advantage``. The recurrent
actor-critic (IMPALA) puts an ``lstm`` between ``linear`` and the heads.

Rainbow (Hessel et al. 2018) options of ``QNetwork``: ``noisy_sigma0`` replaces ``linear`` and the heads by
factorised-Gaussian noisy layers (``NoisyLinear``, Fortunato et al. 2018), ``atoms`` > 1 makes every head output a
categorical distribution over ``atoms`` returns in [v_min, v_max] (C51, Bellemare et al. 2017); Q = Σ_j z_j p_j.

``part_names`` lists the parts lower → higher layers, as the completion study expects.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from modelward.core.config import StrictModel
from modelward.core.init import init_weight_
from modelward.errors import ConfigError
from modelward.rl.envs import EnvSpec

State = tuple[torch.Tensor, torch.Tensor] | None


class NetConfig(StrictModel):
    """Network shape. ``torso = auto`` picks atari (3×84×84-ish images), minatar (small images) or mlp (vectors)."""

    torso: Literal["auto", "atari", "minatar", "mlp", "resnet"] = "auto"
    channels: list[int] | None = Field(None, min_length=3, max_length=3)
    hidden: int | None = Field(None, gt=0)


def _torso_kind(cfg: NetConfig, spec: EnvSpec) -> str:
    if cfg.torso != "auto":
        kind = cfg.torso
    elif not spec.is_image:
        kind = "mlp"
    else:
        kind = "atari" if min(spec.obs_shape[1:]) >= 36 else "minatar"
    if kind in ("atari", "minatar", "resnet") and not spec.is_image:
        raise ConfigError(f"rl.net.torso={kind!r} needs image observations; {spec.env_id} has {spec.obs_shape}")
    if kind == "mlp" and spec.is_image:
        raise ConfigError(f"rl.net.torso='mlp' needs vector observations; {spec.env_id} has {spec.obs_shape}")
    return kind


class NoisyLinear(nn.Module):
    """Linear layer with factorised Gaussian noise (Fortunato et al. 2018, §3 Eq. 9–11; Rainbow's exploration):
    w = μ_w + σ_w ⊙ f(ε_out) f(ε_in)ᵀ, b = μ_b + σ_b ⊙ f(ε_out), f(x) = sgn(x)·√|x|, ε ~ N(0, 1).

    Noise is used in training mode and switched off (the mean weights μ) in ``eval()`` mode. ``reset_noise(g)``
    draws a new ε from generator `g`. Initialisation (``init_own_``): μ_w with the study's scheme, μ_b = 0,
    σ = σ0/√fan_in (Fortunato et al.'s factorised-noise init).

    Args: in_features, out_features, sigma0 (0.5 in Rainbow).
    Example: ``layer = NoisyLinear(128, 3); layer.reset_noise(torch.Generator().manual_seed(0))``
    """

    def __init__(self, in_features: int, out_features: int, sigma0: float = 0.5) -> None:
        super().__init__()
        self.in_features, self.out_features, self.sigma0 = in_features, out_features, sigma0
        self.weight_mu = nn.Parameter(torch.empty(out_features, in_features))
        self.weight_sigma = nn.Parameter(torch.empty(out_features, in_features))
        self.bias_mu = nn.Parameter(torch.empty(out_features))
        self.bias_sigma = nn.Parameter(torch.empty(out_features))
        # the noise is not state: non-persistent, so checkpoints hold only μ and σ
        self.register_buffer("eps_in", torch.zeros(in_features), persistent=False)
        self.register_buffer("eps_out", torch.zeros(out_features), persistent=False)
        bound = 1.0 / math.sqrt(in_features)
        with torch.no_grad():
            self.weight_mu.uniform_(-bound, bound)
            self.bias_mu.uniform_(-bound, bound)
            self.weight_sigma.fill_(sigma0 * bound)
            self.bias_sigma.fill_(sigma0 * bound)

    @torch.no_grad()
    def init_own_(self, scheme: str, generator: torch.Generator | None, names: set[str]) -> None:
        if "weight_mu" in names:
            init_weight_(self.weight_mu, scheme, generator)
        if "bias_mu" in names:
            self.bias_mu.zero_()
        for n in ("weight_sigma", "bias_sigma"):
            if n in names:
                getattr(self, n).fill_(self.sigma0 / math.sqrt(self.in_features))

    @staticmethod
    def _f(x: torch.Tensor) -> torch.Tensor:
        return x.sign() * x.abs().sqrt()

    @torch.no_grad()
    def reset_noise(self, generator: torch.Generator | None = None) -> None:
        dev = self.weight_mu.device
        self.eps_in.copy_(self._f(torch.randn(self.in_features, generator=generator)).to(dev))
        self.eps_out.copy_(self._f(torch.randn(self.out_features, generator=generator)).to(dev))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return F.linear(x, self.weight_mu, self.bias_mu)
        w = self.weight_mu + self.weight_sigma * torch.outer(self.eps_out, self.eps_in)
        return F.linear(x, w, self.bias_mu + self.bias_sigma * self.eps_out)


def reset_noise(net: nn.Module, generator: torch.Generator | None = None) -> None:
    """Draw fresh noise for every NoisyLinear in `net` (no-op without noisy layers)."""
    for m in net.modules():
        if isinstance(m, NoisyLinear):
            m.reset_noise(generator)


def _linear(n_in: int, n_out: int, sigma0: float | None) -> nn.Module:
    return nn.Linear(n_in, n_out) if sigma0 is None else NoisyLinear(n_in, n_out, sigma0)


class _ResBlock(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(ch, ch, 3, 1, 1)
        self.conv2 = nn.Conv2d(ch, ch, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(F.relu(self.conv1(F.relu(x))))


class ResNetSection(nn.Module):
    """One IMPALA section: conv 3×3 → max-pool 3×3 stride 2 → two residual blocks (Espeholt et al. 2018, Fig. 3)."""

    def __init__(self, c_in: int, ch: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, ch, 3, 1, 1)
        self.res1 = _ResBlock(ch)
        self.res2 = _ResBlock(ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(self.conv(x), 3, 2, 1)
        return self.res2(self.res1(x))


class _Torso(nn.Module):
    """Builds conv1..conv3 + linear (or fc1 + linear, or s1..s3 + linear) as direct children so part names are
    top-level."""

    conv_parts = ("conv1", "conv2", "conv3", "linear")
    mlp_parts = ("fc1", "linear")
    resnet_parts = ("s1.conv", "s2.conv", "s3.conv", "linear")

    def _build_torso(self, cfg: NetConfig, spec: EnvSpec, noisy_sigma0: float | None = None) -> int:
        self.scale = spec.scale
        self.kind = _torso_kind(cfg, spec)
        if self.kind == "mlp":
            hidden = cfg.hidden or 64
            self.fc1 = nn.Linear(int(torch.tensor(spec.obs_shape).prod()), hidden)
            self.linear = _linear(hidden, hidden, noisy_sigma0)
            self.torso_parts = self.mlp_parts
            return hidden
        c_in, h, w = spec.obs_shape
        if self.kind == "resnet":
            ch = cfg.channels or [16, 32, 32]
            hidden = cfg.hidden or 256
            self.s1 = ResNetSection(c_in, ch[0])
            self.s2 = ResNetSection(ch[0], ch[1])
            self.s3 = ResNetSection(ch[1], ch[2])
            with torch.no_grad():
                n_flat = self._convs(torch.zeros(1, c_in, h, w)).shape[1]
            self.linear = _linear(n_flat, hidden, noisy_sigma0)
            self.torso_parts = self.resnet_parts
            return hidden
        if self.kind == "atari":
            ch = cfg.channels or [32, 64, 64]
            hidden = cfg.hidden or 512
            geo = [(8, 4, 0), (4, 2, 0), (3, 1, 0)]
        else:
            ch = cfg.channels or [16, 32, 32]
            hidden = cfg.hidden or 128
            geo = [(3, 1, 1), (3, 2, 1), (3, 1, 1)]
        self.conv1 = nn.Conv2d(c_in, ch[0], geo[0][0], geo[0][1], geo[0][2])
        self.conv2 = nn.Conv2d(ch[0], ch[1], geo[1][0], geo[1][1], geo[1][2])
        self.conv3 = nn.Conv2d(ch[1], ch[2], geo[2][0], geo[2][1], geo[2][2])
        with torch.no_grad():
            n_flat = self._convs(torch.zeros(1, c_in, h, w)).shape[1]
        self.linear = _linear(n_flat, hidden, noisy_sigma0)
        self.torso_parts = self.conv_parts
        return hidden

    def _convs(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "resnet":
            return F.relu(self.s3(self.s2(self.s1(x)))).flatten(1)
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.relu(self.conv3(x))
        return x.flatten(1)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float() * self.scale
        if self.kind == "mlp":
            return F.relu(self.linear(F.relu(self.fc1(x.flatten(1)))))
        return F.relu(self.linear(self._convs(x)))


class ActorCritic(_Torso):
    """π(a|o) and V(o) heads on a shared torso; with ``recurrent`` an LSTM sits between torso and heads."""

    def __init__(self, spec: EnvSpec, cfg: NetConfig | None = None, recurrent: bool = False) -> None:
        super().__init__()
        cfg = cfg or NetConfig()
        hidden = self._build_torso(cfg, spec)
        self.recurrent = recurrent
        self.hidden = hidden
        if recurrent:
            self.lstm = nn.LSTM(hidden, hidden)
        self.policy = nn.Linear(hidden, spec.n_actions)
        self.value = nn.Linear(hidden, 1)
        self.part_names = [*self.torso_parts, *(["lstm"] if recurrent else []), "policy", "value"]

    def initial_state(self, batch: int) -> State:
        if not self.recurrent:
            return None
        z = torch.zeros(1, batch, self.hidden, device=self.policy.weight.device)
        return (z, z.clone())

    def forward(self, obs: torch.Tensor, state: State = None) -> tuple[torch.Tensor, torch.Tensor, State]:
        """One step for a batch: (logits, value, next state)."""
        z = self.features(obs)
        if self.recurrent:
            out, state = self.lstm(z.unsqueeze(0), state)
            z = out.squeeze(0)
        return self.policy(z), self.value(z).squeeze(-1), state

    def unroll(self, obs: torch.Tensor, state: State, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """T steps × N envs (truncated BPTT): obs [T,N,...], starts [T,N] = 1 where a new episode begins (the
        recurrent state is zeroed there). Returns logits [T,N,A] and values [T,N]."""
        t, n = obs.shape[:2]
        z = self.features(obs.reshape(t * n, *obs.shape[2:]))
        if self.recurrent:
            z = z.reshape(t, n, -1)
            outs = []
            h, c = state
            for i in range(t):
                keep = (1.0 - starts[i]).view(1, n, 1)
                out, (h, c) = self.lstm(z[i : i + 1], (h * keep, c * keep))
                outs.append(out[0])
            z = torch.stack(outs).reshape(t * n, -1)
        return self.policy(z).reshape(t, n, -1), self.value(z).reshape(t, n)


class QNetwork(_Torso):
    """Q(o, ·) on the same torso; ``dueling`` splits the head into ``value`` and ``advantage`` (Wang et al. 2016).

    Args: spec, cfg; dueling; noisy_sigma0 (None = plain linear layers; Rainbow: 0.5 — ``linear`` and the heads
    become ``NoisyLinear``); atoms (1 = scalar Q; Rainbow: 51 — a categorical return distribution on the support
    z_j = v_min + j·(v_max − v_min)/(atoms − 1)), v_min, v_max.
    Example: ``QNetwork(spec, noisy_sigma0=0.5, atoms=51).log_dist(obs)`` → log p [B, A, 51].
    """

    def __init__(self, spec: EnvSpec, cfg: NetConfig | None = None, dueling: bool = True,
                 noisy_sigma0: float | None = None, atoms: int = 1, v_min: float = -10.0,
                 v_max: float = 10.0) -> None:
        super().__init__()
        cfg = cfg or NetConfig()
        hidden = self._build_torso(cfg, spec, noisy_sigma0)
        self.dueling = dueling
        self.n_actions = spec.n_actions
        self.atoms = int(atoms)
        self.register_buffer("support", torch.linspace(v_min, v_max, self.atoms) if self.atoms > 1
                             else torch.zeros(1), persistent=False)
        if dueling:
            self.value = _linear(hidden, self.atoms, noisy_sigma0)
            self.advantage = _linear(hidden, spec.n_actions * self.atoms, noisy_sigma0)
            heads = ["value", "advantage"]
        else:
            self.q = _linear(hidden, spec.n_actions * self.atoms, noisy_sigma0)
            heads = ["q"]
        self.part_names = [*self.torso_parts, *heads]

    def _head(self, obs: torch.Tensor) -> torch.Tensor:
        """[B, A, atoms] action values (scalar net) or logits (distributional)."""
        z = self.features(obs)
        if not self.dueling:
            return self.q(z).view(-1, self.n_actions, self.atoms)
        adv = self.advantage(z).view(-1, self.n_actions, self.atoms)
        return self.value(z).view(-1, 1, self.atoms) + adv - adv.mean(dim=1, keepdim=True)

    def log_dist(self, obs: torch.Tensor) -> torch.Tensor:
        """log p(z_j | o, a), shape [B, A, atoms] (distributional nets only)."""
        return F.log_softmax(self._head(obs), dim=-1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q(o, a) for every action, [B, A] (the expectation Σ_j z_j p_j for a distributional net)."""
        h = self._head(obs)
        if self.atoms == 1:
            return h.squeeze(-1)
        return (F.softmax(h, dim=-1) * self.support).sum(-1)
