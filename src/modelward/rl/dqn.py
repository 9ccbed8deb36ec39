"""DQN-family agent up to full Rainbow (seed 000 §4–5, App. A "Rainbow"; Hessel et al. 2018): double Q-learning,
dueling heads, prioritized replay, n-step returns, noisy nets and the distributional (C51) head; each part can be
switched off.

- scalar head: importance-weighted Huber loss on y = R^(n) + γ^n·Q_target(s_{t+n}, argmax_a Q(s_{t+n}, a)) (double);
- distributional head (Bellemare et al. 2017, Alg. 1 with n-step returns as in Rainbow Eq. 2–3): the target
  distribution of Z_target(s_{t+n}, a*) shifted to R^(n) + γ^n z_j, projected onto the support; loss = importance-
  weighted cross-entropy −Σ_j m_j log p_j(s_t, a_t), which is also the new priority (Rainbow's KL priority up to a
  constant);
- noisy nets: exploration comes from the noise of ``NoisyLinear`` layers (redrawn every ``train_every`` steps, the
  target net's independently per update); evaluation uses the mean weights; ε is 0 in ``RainbowConfig``.

The replay buffer is an input and an output of training, so retraining can start with the trained agent's buffer
("kept") or an empty one ("reset"). Updates start once the buffer holds `learning_starts` transitions — with a kept
buffer that is at once. Exploration in retraining (``exploration``): ``"schedule"`` runs the ε schedule from
``eps_start`` (training from scratch, T0); ``"final"`` starts at ``eps_end``, where the original run's exploration
ended — the default for retraining T1–T4 (the retrained agent keeps the trained agent's exploration state, as
Rainbow's kept σ parameters of noisy layers do, instead of acting at random again).
"""

from __future__ import annotations

import copy
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator

from modelward.core.config import StrictModel
from modelward.core.modules import eval_mode, model_device
from modelward.errors import ConfigError
from modelward.rl.checkpoint import RLCheckpoint
from modelward.rl.envs import EnvSpec, env_seeds, make_vector_env
from modelward.rl.evaluate import ActFn, CurveRecorder
from modelward.rl.nets import NetConfig, QNetwork, reset_noise
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
    noisy: bool = False  # NoisyLinear `linear` and heads (Fortunato et al. 2018)
    noisy_sigma0: float = Field(0.5, gt=0.0)
    distributional: bool = False  # C51 head (Bellemare et al. 2017)
    atoms: int = Field(51, ge=2)
    v_min: float = -10.0
    v_max: float = 10.0
    clip_rewards: bool = False  # clip rewards to [−1, 1] (the DQN/Rainbow Atari convention)
    retrain_exploration: Literal["continue", "restart"] = "continue"

    @model_validator(mode="after")
    def _support(self) -> DQNConfig:
        if self.v_max <= self.v_min:
            raise ValueError(f"v_max ({self.v_max}) must be greater than v_min ({self.v_min})")
        return self


class RainbowConfig(DQNConfig):
    """Rainbow's hyper-parameters (Hessel et al. 2018, Table 1; seed 000 App. A: "the same network architecture and
    hyperparameters as reported in Hessel et al."), in environment steps of 4 frames: updates from 80k frames
    (20k steps), target period 32k frames (8k steps), Adam lr 6.25e-5 and ε 1.5e-4, noisy σ0 0.5 and no ε-greedy,
    prioritization ω 0.5 with β 0.4 → 1, 3-step returns, 51 atoms on [−10, 10], batch 32, a replay of 1M
    transitions, an update every 4 steps, γ 0.99, rewards clipped to [−1, 1]. Evaluation ε = 0.001 (mean weights
    of the noisy layers plus a tiny ε, as in Dopamine's Rainbow). Lower ``buffer_size`` / ``learning_starts`` for
    short CPU studies (a 1M-transition buffer of 4×84×84 frames needs ~56 GB)."""

    buffer_size: int = Field(1_000_000, ge=1)
    lr: float = Field(6.25e-5, gt=0.0)
    learning_starts: int = Field(20_000, ge=1)
    target_update: int = Field(8_000, ge=1)
    eps_start: float = Field(0.0, ge=0.0, le=1.0)
    eps_end: float = Field(0.0, ge=0.0, le=1.0)
    eval_epsilon: float = Field(0.001, ge=0.0, le=1.0)
    noisy: bool = True
    distributional: bool = True
    clip_rewards: bool = True


def new_buffer(cfg: DQNConfig, obs_shape: tuple[int, ...], obs_dtype: np.dtype) -> ReplayBuffer:
    return ReplayBuffer(cfg.buffer_size, obs_shape, obs_dtype, cfg.prioritized, cfg.priority_alpha)


def build_q_network(spec: EnvSpec, net_cfg: NetConfig, cfg: DQNConfig) -> QNetwork:
    """The Q network `cfg` asks for (dueling / noisy / distributional)."""
    return QNetwork(spec, net_cfg, dueling=cfg.dueling, noisy_sigma0=cfg.noisy_sigma0 if cfg.noisy else None,
                    atoms=cfg.atoms if cfg.distributional else 1, v_min=cfg.v_min, v_max=cfg.v_max)


def train_dqn(net: QNetwork, env_id: str, cfg: DQNConfig, seed: int, steps: int, recorder: CurveRecorder,
              buffer: ReplayBuffer | None = None, trainable: set[str] | None = None,
              max_episode_steps: int | None = None,
              exploration: Literal["schedule", "final"] = "schedule",
              checkpoint: RLCheckpoint | None = None) -> tuple[list[tuple[int, float]], ReplayBuffer]:
    """Train `net` in place for `steps` environment steps; returns (curve, replay buffer).

    Args: net (built by ``build_q_network(.., cfg)``), env_id, cfg, seed (every random choice: ε-greedy, replay
    sampling, noise), steps, recorder (evaluations), buffer (None = a new empty one), trainable (T2: the only
    parameters optimised), max_episode_steps, exploration ("schedule": ε from eps_start; "final": ε = eps_end from
    the first step — retraining that keeps the trained agent's exploration state), checkpoint (mid-run
    checkpoints and resume, ``rl.checkpoint``; the replay buffer is saved with ``checkpoint.keep_buffer``).
    Example: ``curve, buf = train_dqn(build_q_network(spec, NetConfig(), cfg), "CartPole-v1", cfg, 0, 5000, rec)``
    """
    if (net.atoms > 1) != cfg.distributional or net.atoms not in (1, cfg.atoms):
        raise ConfigError(f"the Q network has {net.atoms} atom(s) but dqn.distributional={cfg.distributional}, "
                          f"atoms={cfg.atoms}; build it with build_q_network")
    params = [p for n, p in net.named_parameters() if trainable is None or n in trainable]
    for n, p in net.named_parameters():
        p.requires_grad_(trainable is None or n in trainable)
    opt = torch.optim.Adam(params, lr=cfg.lr, eps=cfg.adam_eps)
    target = copy.deepcopy(net).requires_grad_(False)
    rng = np.random.default_rng(seed)  # every random choice of training (ε-greedy, replay sampling)
    gen = torch.Generator().manual_seed(seed)  # the noisy layers' noise
    net.train()
    reset_noise(net, gen)
    dev = model_device(net)  # the nets act and learn there; the replay buffer stays on the CPU
    n = cfg.n_envs
    venv = make_vector_env(env_id, n, seed, max_episode_steps)
    try:
        obs, _ = venv.reset(seed=env_seeds(seed, n))
        if buffer is None:
            buffer = new_buffer(cfg, obs.shape[1:], obs.dtype)
        folders = [NStepFolder(cfg.n_step, cfg.gamma) for _ in range(n)]
        cost, since_train, since_target = 0, 0, 0
        since_noise = last_ck = 0
        nets, gens, rngs = {"net": net, "target": target}, {"gen": gen}, {"rng": rng}
        resumed = checkpoint.load(recorder, nets, opt, gens, rngs) if checkpoint else None
        if resumed is not None:
            cnt = resumed[0]["counters"]
            cost = last_ck = int(resumed[0]["cost"])
            since_train, since_target, since_noise = cnt["since_train"], cnt["since_target"], cnt["since_noise"]
            if resumed[1] is not None:
                buffer = resumed[1]
            # the environments restart as after the boundary (see rl.checkpoint)
            obs, _ = venv.reset(seed=RLCheckpoint.env_seeds(seed, cost, n))
        elif recorder.start():
            return recorder.finish(cost), buffer
        eps_steps = max(1, int(cfg.eps_fraction * steps))
        while cost < steps:
            frac = max(0.0, 1.0 - cost / eps_steps) if exploration == "schedule" else 0.0
            eps = cfg.eps_end + (cfg.eps_start - cfg.eps_end) * frac
            with torch.no_grad():
                greedy = net(torch.as_tensor(obs).to(dev)).argmax(1).cpu().numpy()
            explore = rng.random(n) < eps
            actions = np.where(explore, rng.integers(0, venv.single_action_space.n, size=n), greedy)
            nxt, r, term, trunc, info = venv.step(actions)
            if cfg.clip_rewards:
                r = np.clip(r, -1.0, 1.0)
            for i in range(n):
                done = bool(term[i] or trunc[i])
                real_next = info["final_obs"][i] if done else nxt[i]
                for tr in folders[i].push(obs[i], int(actions[i]), float(r[i]), real_next, bool(term[i]), done):
                    buffer.add(*tr)
            obs = nxt
            cost += n
            since_train += n
            since_target += n
            since_noise += n
            if since_noise >= cfg.train_every:  # a new exploration noise sample for acting (and the next update)
                since_noise = 0
                reset_noise(net, gen)
            if len(buffer) >= cfg.learning_starts:
                while since_train >= cfg.train_every:
                    since_train -= cfg.train_every
                    beta = cfg.priority_beta0 + (1.0 - cfg.priority_beta0) * min(1.0, cost / steps)
                    reset_noise(target, gen)
                    _update(net, target, opt, params, buffer, cfg, rng, beta)
                if since_target >= cfg.target_update:
                    since_target = 0
                    target.load_state_dict(net.state_dict())
            else:
                since_train = 0
            if recorder.step(cost):
                break
            if checkpoint is not None and checkpoint.due(cost, last_ck, recorder):
                last_ck = cost  # a boundary: episodes end as truncations, restart from (seed, cost), then save
                for i in range(n):
                    for tr in folders[i].flush(obs[i]):
                        buffer.add(*tr)
                obs, _ = venv.reset(seed=RLCheckpoint.env_seeds(seed, cost, n))
                checkpoint.save(cost, recorder, nets, opt, gens, rngs,
                                {"since_train": since_train, "since_target": since_target,
                                 "since_noise": since_noise}, buffer)
        return recorder.finish(cost), buffer
    finally:
        venv.close()
        for p in net.parameters():
            p.requires_grad_(True)


def _update(net: QNetwork, target: QNetwork, opt: torch.optim.Optimizer, params: list[torch.nn.Parameter],
            buffer: ReplayBuffer, cfg: DQNConfig, rng: np.random.Generator, beta: float) -> None:
    b, idx = buffer.sample(cfg.batch_size, rng, beta)
    dev = model_device(net)
    b = {k: v.to(dev, non_blocking=True) for k, v in b.items()}  # the sampled batch goes to the nets' device
    if net.atoms > 1:
        loss_i = distributional_loss(net, target, b, cfg.double)
        loss = (b["weight"] * loss_i).mean()
        _step(opt, params, loss, cfg.max_grad_norm)
        buffer.update_priorities(idx, loss_i.detach().cpu().numpy())
        return
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
    _step(opt, params, loss, cfg.max_grad_norm)
    buffer.update_priorities(idx, td.detach().abs().cpu().numpy())


def _step(opt: torch.optim.Optimizer, params: list[torch.nn.Parameter], loss: torch.Tensor, clip: float) -> None:
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, clip)
    opt.step()


def project_distribution(probs: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor,
                         support: torch.Tensor) -> torch.Tensor:
    """Categorical projection Φ(R + γ^n z) (Bellemare et al. 2017, Alg. 1; Rainbow Eq. 3).

    Args: probs [B, K] of the bootstrap distribution, reward [B] (n-step return R^(n)), discount [B]
    (γ^n, 0 at a terminal), support [K] (evenly spaced z_0..z_{K−1}).
    Returns: m [B, K], the target distribution on the support (each row sums to 1).
    Example: a terminal transition with R = z_3 puts all mass on atom 3.
    """
    k = support.numel()
    v_min, v_max = float(support[0]), float(support[-1])
    dz = (v_max - v_min) / (k - 1)
    tz = (reward.unsqueeze(1) + discount.unsqueeze(1) * support.unsqueeze(0)).clamp(v_min, v_max)
    b = (tz - v_min) / dz
    lo, hi = b.floor().long(), b.ceil().long()
    # b on an atom: lo == hi would drop its mass; move one side so the whole mass lands on that atom
    lo[(hi > 0) & (lo == hi)] -= 1
    hi[(lo < k - 1) & (lo == hi)] += 1
    m = torch.zeros_like(probs)
    m.scatter_add_(1, lo, probs * (hi.float() - b))
    m.scatter_add_(1, hi, probs * (b - lo.float()))
    return m


def distributional_loss(net: QNetwork, target: QNetwork, b: dict[str, torch.Tensor], double: bool) -> torch.Tensor:
    """Per-transition cross-entropy −Σ_j m_j log p_j(s_t, a_t) against the projected n-step target; with `double`
    the bootstrap action is argmax of the online net's Q (Rainbow), else of the target net's."""
    rows = torch.arange(len(b["action"]), device=b["action"].device)
    logp = net.log_dist(b["obs"])[rows, b["action"]]
    with torch.no_grad():
        a_star = (net if double else target)(b["next_obs"]).argmax(1)
        p_next = target.log_dist(b["next_obs"])[rows, a_star].exp()
        m = project_distribution(p_next, b["reward"], b["discount"], target.support)
    return -(m * logp).sum(1)


def q_policy(net: QNetwork, n_actions: int, epsilon: float, seed: int) -> ActFn:
    """ε-greedy evaluation policy (ε = `eval_epsilon`, as in the DQN/Rainbow evaluation protocol); noisy layers act
    with their mean weights."""
    rng = np.random.default_rng(seed)

    def act(obs: np.ndarray, live: list[int]) -> np.ndarray:
        with eval_mode(net), torch.no_grad():  # noisy layers: the mean weights
            greedy = net(torch.as_tensor(obs).to(model_device(net))).argmax(1).cpu().numpy()
        explore = rng.random(len(obs)) < epsilon
        return np.where(explore, rng.integers(0, n_actions, size=len(obs)), greedy)

    return act
