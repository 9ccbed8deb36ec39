"""Environments (MinAtar, classic control, ALE with standard preprocessing) and the agents' part-named networks."""

import numpy as np
import pytest

from modelward.errors import ConfigError
from modelward.rl.envs import SUITES, env_spec, make_env, make_vector_env, resolve_games
from modelward.rl.nets import ActorCritic


def test_minatar_is_channels_first_uint8():
    env = make_env("MinAtar/Breakout-v1")
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 10, 10) and obs.dtype == np.uint8 and set(np.unique(obs)) <= {0, 1}
    spec = env_spec("MinAtar/Breakout-v1")
    assert spec.n_actions == 3 and spec.is_image and spec.scale == 1.0


def test_atari_standard_preprocessing():
    spec = env_spec("ALE/Pong-v5")
    assert spec.obs_shape == (4, 84, 84) and spec.scale == pytest.approx(1 / 255)
    net = ActorCritic(spec)
    assert net.kind == "atari" and net.linear.in_features == 7 * 7 * 64 and net.linear.out_features == 512


def test_time_limit_and_vector_env_same_step_reset():
    venv = make_vector_env("MinAtar/Breakout-v1", 2, seed=0, max_episode_steps=3)
    venv.reset(seed=[0, 1])
    for _ in range(2):
        _, _, term, trunc, _ = venv.step(np.zeros(2, dtype=np.int64))
    _, _, term, trunc, info = venv.step(np.zeros(2, dtype=np.int64))
    assert (term | trunc).all() and "final_obs" in info
    venv.close()


def test_suites_and_errors():
    assert resolve_games(None, "minatar", None) == SUITES["minatar"]
    assert resolve_games("CartPole-v1", None, None) == ["CartPole-v1"]
    with pytest.raises(ConfigError, match="valid choices"):
        resolve_games(None, "nope", None)
    with pytest.raises(ConfigError, match="cannot be made"):
        make_env("NoSuchEnv-v0")


def test_episode_cap_full_game_by_default():
    from modelward.rl.envs import UNBOUNDED_CAP, episode_cap

    assert episode_cap("ALE/Pong-v5", None) is None  # ALE ends the game itself (108k frames)
    assert episode_cap("CartPole-v1", None) is None  # registered time limit
    assert episode_cap("MinAtar/Breakout-v1", None) == UNBOUNDED_CAP  # never ends by itself
    assert episode_cap("ALE/Pong-v5", 500) == 500
