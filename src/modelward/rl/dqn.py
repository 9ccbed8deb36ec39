"""DQN-family agent with Rainbow's ingredients that matter here (seed 000 §4–5, App. A "Rainbow"; Hessel et al. 2018):
double Q-learning, dueling heads, prioritized replay, n-step returns; ε-greedy exploration (noisy nets and the
distributional head are not implemented). Loss: importance-weighted Huber on
  y = R^(n) + γ^n·Q_target(s_{t+n}, argmax_a Q(s_{t+n}, a))   (double) .
The replay buffer is an input and an output of training, so retraining can start with the trained agent's buffer
("kept") or an empty one ("reset"). Updates start once the buffer holds `learning_starts` transitions — with a kept
buffer that is at once. The ε schedule restarts in retraining (T' repeats T; App. A: "all hyperparameters are kept
the same during training and retraining").
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from modelward.core.config import StrictModel
from modelward.rl.envs import env_seeds, make_vector_env
from modelward.rl.evaluate import ActFn, CurveRecorder
from modelward.rl.nets import QNetwork
from modelward.rl.replay import NStepFolder, ReplayBuffer


class DQNConfig(StrictModel):
    n_envs: int = Field(1, ge=1)
    buffer_size: int = Field(50_000, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(1e-4, gt=0.0)
    adam_eps: float = Field(1.5e-4, gt=0.0)
    gamma: float = Field(0.99, ge=0.0, le=1.0)
    n_step: int = Field(3, ge=1)
    double: bool = True
    dueling: bool = True
    prioritized: bool = True
    priority_alpha: float = Field(0.5, ge=0.0)
    priority_beta0: float = Field(0.4, ge=0.0, le=1.0)
    learning_starts: int = Field(1000, ge=1)
    train_every: int = Field(4, ge=1)
    target_update: int = Field(1000, ge=1)
    eps_start: float = Field(1.0, ge=0.0, le=1.0)
    eps_end: float = Field(0.05, ge=0.0, le=1.0)
    eps_fraction: float = Field(0.25, gt=0.0, le=1.0)
    eval_epsilon: float = Field(0.01, ge=0.0, le=1.0)
    max_grad_norm: float = Field(10.0, gt=0.0)


def new_buffer(cfg: DQNConfig, obs_shape: tuple[int, ...], obs_dtype: np.dtype) -> ReplayBuffer:
    return ReplayBuffer(cfg.buffer_size, obs_shape, obs_dtype, cfg.prioritized, cfg.priority_alpha)


def train_dqn(net: QNetwork, env_id: str, cfg: DQNConfig, seed: int, steps: int, recorder: CurveRecorder,
              buffer: ReplayBuffer | None = None, trainable: set[str] | None = None,
              max_episode_steps: int | None = None) -> tuple[list[tuple[int, float]], ReplayBuffer]:
    """Train `net` in place for `steps` environment steps; returns (curve, replay buffer)."""
    params = [p for n, p in net.named_parameters() if trainable is None or n in trainable]
    for n, p in net.named_parameters():
        p.requires_grad_(trainable is None or n in trainable)
    opt = torch.optim.Adam(params, lr=cfg.lr, eps=cfg.adam_eps)
    target = copy.deepcopy(net).requires_grad_(False)
    rng = np.random.default_rng(seed)  # every random choice of training (ε-greedy, replay sampling)
    n = cfg.n_envs
    venv = make_vector_env(env_id, n, seed, max_episode_steps)
    try:
        obs, _ = venv.reset(seed=env_seeds(seed, n))
        if buffer is None:
            buffer = new_buffer(cfg, obs.shape[1:], obs.dtype)
        folders = [NStepFolder(cfg.n_step, cfg.gamma) for _ in range(n)]
        cost, since_train, since_target = 0, 0, 0
        if recorder.start():
            return recorder.finish(cost), buffer
        eps_steps = max(1, int(cfg.eps_fraction * steps))
        while cost < steps:
            eps = cfg.eps_end + (cfg.eps_start - cfg.eps_end) * max(0.0, 1.0 - cost / eps_steps)
            with torch.no_grad():
                greedy = net(torch.as_tensor(obs)).argmax(1).numpy()
            explore = rng.random(n) < eps
            actions = np.where(explore, rng.integers(0, venv.single_action_space.n, size=n), greedy)
            nxt, r, term, trunc, info = venv.step(actions)
            for i in range(n):
                done = bool(term[i] or trunc[i])
                real_next = info["final_obs"][i] if done else nxt[i]
                for tr in folders[i].push(obs[i], int(actions[i]), float(r[i]), real_next, bool(term[i]), done):
                    buffer.add(*tr)
            obs = nxt
            cost += n
            since_train += n
            since_target += n
            if len(buffer) >= cfg.learning_starts:
                while since_train >= cfg.train_every:
                    since_train -= cfg.train_every
                    beta = cfg.priority_beta0 + (1.0 - cfg.priority_beta0) * min(1.0, cost / steps)
                    _update(net, target, opt, params, buffer, cfg, rng, beta)
                if since_target >= cfg.target_update:
                    since_target = 0
                    target.load_state_dict(net.state_dict())
            else:
                since_train = 0
            if recorder.step(cost):
                break
        return recorder.finish(cost), buffer
    finally:
        venv.close()
        for p in net.parameters():
            p.requires_grad_(True)


def _update(net: QNetwork, target: QNetwork, opt: torch.optim.Optimizer, params: list[torch.nn.Parameter],
            buffer: ReplayBuffer, cfg: DQNConfig, rng: np.random.Generator, beta: float) -> None:
    b, idx = buffer.sample(cfg.batch_size, rng, beta)
    q = net(b["obs"]).gather(1, b["action"].unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        q_next_t = target(b["next_obs"])
        if cfg.double:
            a_star = net(b["next_obs"]).argmax(1, keepdim=True)
            q_next = q_next_t.gather(1, a_star).squeeze(1)
        else:
            q_next = q_next_t.max(1).values
        y = b["reward"] + b["discount"] * q_next
    td = y - q
    loss = (b["weight"] * F.smooth_l1_loss(q, y, reduction="none")).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
    opt.step()
    buffer.update_priorities(idx, td.detach().abs().numpy())


def q_policy(net: QNetwork, n_actions: int, epsilon: float, seed: int) -> ActFn:
    """ε-greedy evaluation policy (ε = `eval_epsilon`, as in the DQN/Rainbow evaluation protocol)."""
    rng = np.random.default_rng(seed)

    def act(obs: np.ndarray, live: list[int]) -> np.ndarray:
        with torch.no_grad():
            greedy = net(torch.as_tensor(obs)).argmax(1).numpy()
        explore = rng.random(len(obs)) < epsilon
        return np.where(explore, rng.integers(0, n_actions, size=len(obs)), greedy)

    return act
