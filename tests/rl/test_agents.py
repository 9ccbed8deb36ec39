"""The agents learn something in seconds (return rises above a random policy), T2 freezes everything else."""

import numpy as np
import torch

from modelward.core.init import init_model_
from modelward.rl.a2c import A2CConfig, ac_policy, train_a2c
from modelward.rl.dqn import DQNConfig, q_policy, train_dqn
from modelward.rl.envs import env_spec
from modelward.rl.evaluate import CurveRecorder, episode_returns, loss_from_returns, random_policy
from modelward.rl.nets import ActorCritic, QNetwork

ENV = "CartPole-v1"


def _random_loss(n_actions: int) -> float:
    return loss_from_returns(episode_returns(random_policy(n_actions, 0), ENV, 8, 500, 300))


def test_a2c_beats_random_on_cartpole():
    torch.set_num_threads(1)
    spec = env_spec(ENV)
    net = init_model_(ActorCritic(spec), seed=0)
    ev = lambda: loss_from_returns(episode_returns(ac_policy(net, 8, 1), ENV, 8, 500, 300))  # noqa: E731
    # lr 2e-3 learns CartPole in 12k steps (< 1 s of CPU): seed 0 reaches random + 48; seeds 0-4 all > random + 20
    curve = train_a2c(net, ENV, A2CConfig(n_envs=8, lr=2e-3), 0, 12_000, CurveRecorder(ev, 6_000))
    assert [c for c, _ in curve] == [0, 6_000, 12_000]
    assert min(v for _, v in curve) < _random_loss(spec.n_actions) - 20  # mean return > random + 20


def test_dqn_beats_random_on_cartpole_and_fills_buffer():
    torch.set_num_threads(1)
    spec = env_spec(ENV)
    net = init_model_(QNetwork(spec), seed=0)
    ev = lambda: loss_from_returns(episode_returns(q_policy(net, 2, 0.0, 1), ENV, 8, 500, 300))  # noqa: E731
    # 2.5k steps (~1.5 s of CPU): seed 0 peaks at random + 146; seeds 0-2 all > random + 60
    cfg = DQNConfig(lr=2e-3, learning_starts=200, target_update=300, eps_fraction=0.3, buffer_size=5_000)
    curve, buf = train_dqn(net, ENV, cfg, 0, 2_500, CurveRecorder(ev, 500))
    assert len(buf) > 2_400 and buf.discount.max() > 0.96 and (buf.discount[: len(buf)] == 0).any()
    assert min(v for _, v in curve) < _random_loss(spec.n_actions) - 20


def test_recurrent_a2c_trains_and_t2_freezes_the_rest():
    torch.set_num_threads(1)
    spec = env_spec("MinAtar/Breakout-v1")
    net = init_model_(ActorCritic(spec, recurrent=True), seed=0)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    trainable = {n for n, _ in net.named_parameters() if n.startswith("lstm.")}
    ev = lambda: loss_from_returns(episode_returns(ac_policy(net, 2, 1), "MinAtar/Breakout-v1", 2, 0, 50))  # noqa
    curve = train_a2c(net, "MinAtar/Breakout-v1", A2CConfig(n_envs=4), 0, 400, CurveRecorder(ev, 200), trainable)
    assert [c for c, _ in curve] == [0, 200, 400]
    after = net.state_dict()
    for k, v in before.items():
        if k.startswith("lstm."):
            assert not torch.equal(v, after[k])
        else:
            assert torch.equal(v, after[k]), k
    assert all(p.requires_grad for p in net.parameters())
    assert np.isfinite([v for _, v in curve]).all()


def test_kept_buffer_trains_at_once_reset_buffer_waits():
    """A kept buffer holds ≥ learning_starts transitions, so updates begin at step 1; an empty one must refill."""
    torch.set_num_threads(1)
    spec = env_spec(ENV)
    cfg = DQNConfig(learning_starts=300, buffer_size=1_000)
    donor = init_model_(QNetwork(spec), seed=1)
    _, full = train_dqn(donor, ENV, cfg.model_copy(update={"learning_starts": 10_000}), 0, 400,
                        CurveRecorder(lambda: 0.0, 400))
    after = {}
    for name, buf in (("kept", full), ("reset", None)):
        net = init_model_(QNetwork(spec), seed=2)
        train_dqn(net, ENV, cfg, 5, 200, CurveRecorder(lambda: 0.0, 200), buffer=buf)
        after[name] = net.state_dict()
    fresh = init_model_(QNetwork(spec), seed=2).state_dict()
    assert all(torch.equal(fresh[k], after["reset"][k]) for k in fresh)  # no update yet
    assert not torch.equal(fresh["linear.weight"], after["kept"]["linear.weight"])
    assert 590 <= len(full) <= 600  # the kept buffer grew by the new steps (minus n-step tails still pending)
