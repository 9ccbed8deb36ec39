"""Environments (MinAtar, classic control, ALE with standard preprocessing) and the agents' part-named networks."""

import pytest
import torch

from modelward.core.parts import resolve_part
from modelward.errors import ConfigError
from modelward.rl.envs import env_spec
from modelward.rl.nets import ActorCritic, NetConfig, QNetwork


def test_actor_critic_parts_lower_to_higher():
    spec = env_spec("MinAtar/Breakout-v1")
    net = ActorCritic(spec)
    assert net.part_names == ["conv1", "conv2", "conv3", "linear", "policy", "value"]
    rec = ActorCritic(spec, recurrent=True)
    assert rec.part_names == ["conv1", "conv2", "conv3", "linear", "lstm", "policy", "value"]
    for name in rec.part_names:
        assert resolve_part(rec, name).params
    logits, value, state = rec(torch.zeros(5, 4, 10, 10), rec.initial_state(5))
    assert logits.shape == (5, 3) and value.shape == (5,) and state[0].shape == (1, 5, rec.hidden)
    with pytest.raises(ConfigError, match="vector observations"):
        ActorCritic(spec, NetConfig(torso="mlp"))


def test_recurrent_unroll_matches_stepping_with_resets():
    torch.manual_seed(0)
    net = ActorCritic(env_spec("CartPole-v1"), recurrent=True)
    obs = torch.randn(4, 3, 4)
    starts = torch.tensor([[1.0, 1, 1], [0, 0, 0], [0, 1, 0], [0, 0, 0]])
    logits, values = net.unroll(obs, net.initial_state(3), starts)
    state = net.initial_state(3)
    for t in range(4):
        keep = (1 - starts[t]).view(1, 3, 1)
        lg, v, state = net(obs[t], (state[0] * keep, state[1] * keep))
        assert torch.allclose(lg, logits[t], atol=1e-6) and torch.allclose(v, values[t], atol=1e-6)


def test_dueling_q_network():
    spec = env_spec("MinAtar/Asterix-v1")
    q = QNetwork(spec)
    assert q.part_names == ["conv1", "conv2", "conv3", "linear", "value", "advantage"]
    assert q(torch.zeros(2, *spec.obs_shape)).shape == (2, spec.n_actions)
    assert QNetwork(spec, dueling=False).part_names[-1] == "q"


def test_impala_resnet_torso_parts():
    spec = env_spec("MinAtar/Breakout-v1")
    net = ActorCritic(spec, NetConfig(torso="resnet"), recurrent=True)
    assert net.part_names == ["s1.conv", "s2.conv", "s3.conv", "linear", "lstm", "policy", "value"]
    assert resolve_part(net, "s1.conv").params == ("s1.conv.weight", "s1.conv.bias")
    assert net.s1.conv.weight.numel() == 3 * 3 * 4 * 16 and net.linear.out_features == 256  # App. B Table 7 shapes
    logits, value, _ = net(torch.zeros(2, *spec.obs_shape), net.initial_state(2))
    assert logits.shape == (2, 3) and value.shape == (2,)
    with pytest.raises(ConfigError, match="image observations"):
        ActorCritic(env_spec("CartPole-v1"), NetConfig(torso="resnet"))
