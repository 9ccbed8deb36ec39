"""Agent networks with named parts (seed 000 App. A, App. B Tables 5–7).

Torsos:
- ``atari``: the standard Atari architecture (Mnih et al. 2015/2016): conv1 8×8/4 (32), conv2 4×4/2 (64),
  conv3 3×3/1 (64), linear 512 — for 4×84×84 inputs.
- ``minatar``: the same 3 conv + 1 FC shape sized for 10×10 inputs: conv1 3×3/1 pad 1, conv2 3×3/2 pad 1 (10→5),
  conv3 3×3/1 pad 1, linear (default channels 16/32/32, linear 128).
- ``mlp``: vector observations (classic control): fc1, linear.
Heads: actor-critic ``policy`` and ``value``; DQN ``q`` or dueling ``value`` + ``advantage``. The recurrent
actor-critic (IMPALA-like experiment) puts an ``lstm`` between ``linear`` and the heads.

``part_names`` lists the parts lower → higher layers, as the completion study expects.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from modelward.core.config import StrictModel
from modelward.errors import ConfigError
from modelward.rl.envs import EnvSpec

State = tuple[torch.Tensor, torch.Tensor] | None


class NetConfig(StrictModel):
    """Network shape. ``torso = auto`` picks atari (3×84×84-ish images), minatar (small images) or mlp (vectors)."""

    torso: Literal["auto", "atari", "minatar", "mlp"] = "auto"
    channels: list[int] | None = Field(None, min_length=3, max_length=3)
    hidden: int | None = Field(None, gt=0)


def _torso_kind(cfg: NetConfig, spec: EnvSpec) -> str:
    if cfg.torso != "auto":
        kind = cfg.torso
    elif not spec.is_image:
        kind = "mlp"
    else:
        kind = "atari" if min(spec.obs_shape[1:]) >= 36 else "minatar"
    if kind in ("atari", "minatar") and not spec.is_image:
        raise ConfigError(f"rl.net.torso={kind!r} needs image observations; {spec.env_id} has {spec.obs_shape}")
    if kind == "mlp" and spec.is_image:
        raise ConfigError(f"rl.net.torso='mlp' needs vector observations; {spec.env_id} has {spec.obs_shape}")
    return kind


class _Torso(nn.Module):
    """Builds conv1..conv3 + linear (or fc1 + linear) as direct children so part names are top-level."""

    conv_parts = ("conv1", "conv2", "conv3", "linear")
    mlp_parts = ("fc1", "linear")

    def _build_torso(self, cfg: NetConfig, spec: EnvSpec) -> int:
        self.scale = spec.scale
        self.kind = _torso_kind(cfg, spec)
        if self.kind == "mlp":
            hidden = cfg.hidden or 64
            self.fc1 = nn.Linear(int(torch.tensor(spec.obs_shape).prod()), hidden)
            self.linear = nn.Linear(hidden, hidden)
            self.torso_parts = self.mlp_parts
            return hidden
        c_in, h, w = spec.obs_shape
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
        self.linear = nn.Linear(n_flat, hidden)
        self.torso_parts = self.conv_parts
        return hidden

    def _convs(self, x: torch.Tensor) -> torch.Tensor:
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
        z = torch.zeros(1, batch, self.hidden)
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
    """Q(o, ·) on the same torso; ``dueling`` splits the head into ``value`` and ``advantage`` (Wang et al. 2016)."""

    def __init__(self, spec: EnvSpec, cfg: NetConfig | None = None, dueling: bool = True) -> None:
        super().__init__()
        cfg = cfg or NetConfig()
        hidden = self._build_torso(cfg, spec)
        self.dueling = dueling
        if dueling:
            self.value = nn.Linear(hidden, 1)
            self.advantage = nn.Linear(hidden, spec.n_actions)
            heads = ["value", "advantage"]
        else:
            self.q = nn.Linear(hidden, spec.n_actions)
            heads = ["q"]
        self.part_names = [*self.torso_parts, *heads]

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        z = self.features(obs)
        if not self.dueling:
            return self.q(z)
        adv = self.advantage(z)
        return self.value(z) + adv - adv.mean(dim=1, keepdim=True)
