"""Environments through the Gymnasium API (seed 000 §4: Atari for A3C/Rainbow; MinAtar is the CPU-sized default).

- ``MinAtar/<Game>-v0|v1`` (Young & Tian 2019): 10×10×C boolean frames, transposed here to C×10×10 uint8.
- ``ALE/<Game>-v5``: the standard preprocessing — no-op starts, frame skip 4 (max-pooled), grey 84×84, stack of 4
  (gymnasium's ``AtariPreprocessing`` + ``FrameStackObservation``); one environment step = 4 frames.
- anything else registered with Gymnasium (classic control: ``CartPole-v1``, ``Acrobot-v1``, ...), vector obs.

A *suite* (``SUITES``) is a list of games treated as one learning problem: one agent per game, MC-hardness averaged
over games within each seed (§4, digest §2.3 "multi-task RL aggregation").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from modelward.errors import ConfigError

MINATAR_GAMES = ("Breakout", "Asterix", "Freeway", "Seaquest", "SpaceInvaders")

SUITES: dict[str, list[str]] = {
    "minatar": [f"MinAtar/{g}-v1" for g in MINATAR_GAMES],
    "minatar-fast": ["MinAtar/Breakout-v1", "MinAtar/Asterix-v1", "MinAtar/SpaceInvaders-v1"],
    "classic": ["CartPole-v1", "Acrobot-v1"],
    "atari-small": ["ALE/Pong-v5", "ALE/Breakout-v5", "ALE/SpaceInvaders-v5", "ALE/Seaquest-v5"],
}


def _register() -> None:
    if "MinAtar/Breakout-v1" not in gym.registry:
        from minatar.gym import register_envs

        register_envs()
    if "ALE/Pong-v5" not in gym.registry:
        import ale_py

        gym.register_envs(ale_py)


def env_kind(env_id: str) -> str:
    if env_id.startswith("MinAtar/"):
        return "minatar"
    if env_id.startswith("ALE/"):
        return "atari"
    return "gym"


class _ChannelsFirst(gym.ObservationWrapper):
    """MinAtar's H×W×C bool frames → C×H×W uint8 (what the conv nets and the replay buffer store)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        h, w, c = env.observation_space.shape
        self.observation_space = gym.spaces.Box(0, 1, (c, h, w), np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.transpose(observation, (2, 0, 1)), dtype=np.uint8)


def make_env(env_id: str, max_episode_steps: int | None = None, sticky_actions: bool = True) -> gym.Env:
    """One environment. `max_episode_steps` caps episodes (truncation) so evaluations stay bounded."""
    _register()
    kind = env_kind(env_id)
    try:
        if kind == "minatar":
            env = gym.make(env_id, sticky_action_prob=0.1 if sticky_actions else 0.0)
            env = _ChannelsFirst(env)
        elif kind == "atari":
            env = gym.make(env_id, frameskip=1, repeat_action_probability=0.25 if sticky_actions else 0.0)
            env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84,
                                                  grayscale_obs=True)
            env = gym.wrappers.FrameStackObservation(env, 4)
        else:
            env = gym.make(env_id)
    except gym.error.Error as e:
        raise ConfigError(f"environment {env_id!r} cannot be made ({e}); e.g. MinAtar/Breakout-v1, "
                          f"CartPole-v1, ALE/Pong-v5; suites: {sorted(SUITES)}") from None
    if not isinstance(env.action_space, gym.spaces.Discrete):
        raise ConfigError(f"environment {env_id!r}: only discrete action spaces are supported")
    if max_episode_steps is not None:
        env = gym.wrappers.TimeLimit(env, max_episode_steps)
    return env


@dataclass(frozen=True)
class EnvSpec:
    """What an agent needs to know about an environment: observation shape/dtype, scale, number of actions."""

    env_id: str
    obs_shape: tuple[int, ...]
    n_actions: int
    scale: float  # multiply observations by this to get the network input (Atari: 1/255)

    @property
    def is_image(self) -> bool:
        return len(self.obs_shape) == 3


def env_spec(env_id: str) -> EnvSpec:
    env = make_env(env_id)
    try:
        shape = tuple(int(s) for s in env.observation_space.shape)
        scale = 1.0 / 255.0 if env_kind(env_id) == "atari" else 1.0
        return EnvSpec(env_id, shape, int(env.action_space.n), scale)
    finally:
        env.close()


def make_vector_env(env_id: str, n: int, seed: int, max_episode_steps: int | None = None) -> SyncVectorEnv:
    """`n` copies stepped in lock-step; finished episodes reset within the same step (SAME_STEP autoreset, the
    final observation is in ``info['final_obs']``), which keeps n-step returns simple. The caller resets it with ``seed=[seed + i ...]``."""
    fns: list[Callable[[], gym.Env]] = [lambda: make_env(env_id, max_episode_steps) for _ in range(n)]
    venv = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    venv.action_space.seed(seed)
    return venv


#: episode cap for environments that never end by themselves (MinAtar): an agent that never loses still stops
UNBOUNDED_CAP = 10_000


def has_own_limit(env_id: str) -> bool:
    """Whether the game ends by itself: ALE caps an episode at 108k frames (27k steps), Gymnasium ids may register
    a time limit (CartPole 500); MinAtar registers none."""
    _register()
    if env_kind(env_id) == "atari":
        return True
    try:
        return gym.spec(env_id).max_episode_steps is not None
    except gym.error.Error:
        return False


def episode_cap(env_id: str, requested: int | None) -> int | None:
    """The step cap to apply: `requested` if given, else None (the full game) for an environment with its own end,
    else ``UNBOUNDED_CAP``."""
    if requested is not None:
        return requested
    return None if has_own_limit(env_id) else UNBOUNDED_CAP


def env_seeds(seed: int, n: int) -> list[int]:
    """`n` distinct 32-bit environment seeds derived from any non-negative `seed` (Gymnasium needs < 2**32)."""
    return [int(x) for x in np.random.SeedSequence(seed).generate_state(n)]


def resolve_games(env: str | None, suite: str | None, games: list[str] | None) -> list[str]:
    """The list of tasks of a learning problem: explicit `games`, a named `suite`, or a single `env`."""
    if games:
        return list(games)
    if suite is not None:
        if suite not in SUITES:
            raise ConfigError(f"rl.suite: unknown suite {suite!r}; valid choices: {sorted(SUITES)}")
        return list(SUITES[suite])
    if env is not None:
        return [env]
    raise ConfigError("rl: give one of 'env', 'suite' or 'games'")
