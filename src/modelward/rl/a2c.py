"""Advantage actor-critic (A2C, the synchronous A3C of Mnih et al. 2016; seed 000 §4, App. A "A3C").

Parallel environments (a Gymnasium vector env) each advance `n_steps`; n-step returns bootstrapped from V(s_{t+n})
(and from V(final obs) when an episode is truncated by a time limit); loss = −log π(a|s)·A − β·H(π) + c_v·(R − V)²/2;
RMSProp (decay 0.99) with the learning rate linearly annealed to 0 over the training length. App. A uses ε = 0.1
with A3C's loss summed over the batch; our loss is a batch mean, so ε defaults to 1e-5 (the usual A2C value).
With a recurrent net the LSTM state is carried across rollouts and zeroed at episode starts (truncated BPTT over the
rollout) — the `recurrent` agent (IMPALA proper is `modelward.rl.impala`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from modelward.core.config import StrictModel
from modelward.core.device import model_device
from modelward.rl.checkpoint import RLCheckpoint
from modelward.rl.envs import env_seeds, make_vector_env
from modelward.rl.evaluate import ActFn, CurveRecorder
from modelward.rl.nets import ActorCritic, State


class A2CConfig(StrictModel):
    n_envs: int = Field(16, ge=1)
    n_steps: int = Field(5, ge=1)
    gamma: float = Field(0.99, ge=0.0, le=1.0)
    lr: float = Field(7e-4, gt=0.0)
    rms_alpha: float = Field(0.99, gt=0.0, lt=1.0)
    rms_eps: float = Field(1e-5, gt=0.0)  # App. A says 0.1 for A3C's summed loss; ours is a batch mean
    entropy_coef: float = Field(0.01, ge=0.0)
    value_coef: float = Field(0.5, ge=0.0)
    max_grad_norm: float = Field(0.5, gt=0.0)
    anneal_lr: bool = True


def _mask_state(state: State, starts: torch.Tensor) -> State:
    if state is None:
        return None
    keep = (1.0 - starts).view(1, -1, 1).to(state[0].device)
    return (state[0] * keep, state[1] * keep)


def train_a2c(net: ActorCritic, env_id: str, cfg: A2CConfig, seed: int, steps: int, recorder: CurveRecorder,
              trainable: set[str] | None = None, max_episode_steps: int | None = None,
              checkpoint: RLCheckpoint | None = None) -> list[tuple[int, float]]:
    """Train `net` in place for `steps` environment steps (cost = env steps summed over the parallel envs).

    `trainable` (T2) restricts the optimised parameters; the others stay bit-identical. With `checkpoint` the run
    saves its state at the checkpoint boundaries and resumes from the file if it exists (``rl.checkpoint``).
    Returns the curve."""
    params = [p for n, p in net.named_parameters() if trainable is None or n in trainable]
    for n, p in net.named_parameters():
        p.requires_grad_(trainable is None or n in trainable)
    opt = torch.optim.RMSprop(params, lr=cfg.lr, alpha=cfg.rms_alpha, eps=cfg.rms_eps)
    gen = torch.Generator().manual_seed(seed)  # actions are sampled on the CPU: the same draws on every device
    dev = model_device(net)  # the net acts and learns there; the rollout buffers stay on the CPU
    n = cfg.n_envs
    venv = make_vector_env(env_id, n, seed, max_episode_steps)
    try:
        obs, _ = venv.reset(seed=env_seeds(seed, n))
        state = net.initial_state(n)
        starts = torch.ones(n)
        cost = last_ck = 0
        resumed = checkpoint.load(recorder, {"net": net}, opt, {"gen": gen}, {}) if checkpoint else None
        if resumed is not None:
            cost = last_ck = int(resumed[0]["cost"])
        elif recorder.start():
            return recorder.finish(cost)
        if resumed is not None:  # the environments restart as after the boundary (see rl.checkpoint)
            obs, _ = venv.reset(seed=RLCheckpoint.env_seeds(seed, cost, n))
            state, starts = net.initial_state(n), torch.ones(n)
        while cost < steps:
            if cfg.anneal_lr:
                for gr in opt.param_groups:
                    gr["lr"] = cfg.lr * max(0.0, 1.0 - cost / steps)
            state0 = None if state is None else (state[0].detach(), state[1].detach())
            ob_buf, act_buf, rew_buf, done_buf, start_buf = [], [], [], [], []
            for _ in range(cfg.n_steps):
                ot = torch.as_tensor(obs)
                with torch.no_grad():
                    state = _mask_state(state, starts)
                    logits, _, state = net(ot.to(dev), state)
                    a = torch.multinomial(F.softmax(logits, -1).cpu(), 1, generator=gen).squeeze(1)
                obs, r, term, trunc, info = venv.step(a.numpy())
                r = torch.as_tensor(r, dtype=torch.float32)
                cut = np.logical_and(trunc, ~term)
                if cut.any():  # a time limit is not a terminal state: bootstrap from the final observation
                    idx = np.flatnonzero(cut)
                    fin = torch.as_tensor(np.stack([info["final_obs"][i] for i in idx]))
                    st = None if state is None else (state[0][:, idx], state[1][:, idx])
                    with torch.no_grad():
                        r[idx] += cfg.gamma * net(fin.to(dev), st)[1].cpu()
                done = torch.as_tensor(np.logical_or(term, trunc), dtype=torch.float32)
                ob_buf.append(ot)
                act_buf.append(a)
                rew_buf.append(r)
                done_buf.append(done)
                start_buf.append(starts)
                starts = done
                cost += n
            with torch.no_grad():
                boot = net(torch.as_tensor(obs).to(dev), _mask_state(state, starts))[1].cpu() * (1.0 - starts)
            returns = torch.empty(cfg.n_steps, n)
            ret = boot
            for t in reversed(range(cfg.n_steps)):
                ret = rew_buf[t] + cfg.gamma * ret * (1.0 - done_buf[t])
                returns[t] = ret
            logits, values = net.unroll(torch.stack(ob_buf).to(dev), state0, torch.stack(start_buf).to(dev))
            returns = returns.to(dev)
            logp = F.log_softmax(logits, -1)
            actions = torch.stack(act_buf).to(dev)
            logp_a = logp.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
            adv = returns - values
            entropy = -(logp.exp() * logp).sum(-1).mean()
            loss = (-(logp_a * adv.detach()).mean() + cfg.value_coef * 0.5 * adv.pow(2).mean()
                    - cfg.entropy_coef * entropy)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            opt.step()
            if recorder.step(cost):
                break
            if checkpoint is not None and checkpoint.due(cost, last_ck, recorder):
                last_ck = cost  # a boundary: episodes restart from (seed, cost) in every run, then save
                obs, _ = venv.reset(seed=RLCheckpoint.env_seeds(seed, cost, n))
                state, starts = net.initial_state(n), torch.ones(n)
                checkpoint.save(cost, recorder, {"net": net}, opt, {"gen": gen}, {}, {})
        return recorder.finish(cost)
    finally:
        venv.close()
        for p in net.parameters():
            p.requires_grad_(True)


def ac_policy(net: ActorCritic, episodes: int, seed: int) -> ActFn:
    """Evaluation policy: actions sampled from π (L is an expectation over a ~ f_θ, §3.1); one LSTM state per
    episode for a recurrent net."""
    gen = torch.Generator().manual_seed(seed)  # sampled on the CPU: the same draws on every device
    state = net.initial_state(episodes)
    dev = model_device(net)

    def act(obs: np.ndarray, live: list[int]) -> np.ndarray:
        with torch.no_grad():
            if state is None:
                logits = net(torch.as_tensor(obs).to(dev))[0]
            else:
                ix = torch.as_tensor(live, device=dev)
                logits, _, (h, c) = net(torch.as_tensor(obs).to(dev), (state[0][:, ix], state[1][:, ix]))
                state[0][:, ix] = h
                state[1][:, ix] = c
            return torch.multinomial(F.softmax(logits, -1).cpu(), 1, generator=gen).squeeze(1).numpy()

    return act


Evaluate = Callable[[], float]
