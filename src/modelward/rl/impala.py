"""IMPALA: actors in separate processes, a learner with V-trace (Espeholt et al. 2018; seed 000 §4, App. A "IMPALA").

- **Actors** (``n_actors`` processes, spawn) each step ``envs_per_actor`` environments for ``unroll_length`` steps
  with their *own copy* of the policy, the behaviour policy μ, and send the trajectory (observations, actions,
  rewards, discounts, log μ(a|x), the LSTM state at the start, the parameter version used) through a bounded queue.
  Before each unroll an actor copies the learner's latest parameters from shared memory if they changed, so μ lags
  the learner by the trajectories still in flight (the "policy lag" V-trace corrects). ``n_actors = 0`` runs one
  actor in the learner's process between updates (on-policy, deterministic; for tests and tiny machines).
- **Learner**: takes ``batch_size`` trajectories, unrolls the network over them (the LSTM from the actors' start
  states, reset at episode starts), computes V-trace targets (``modelward.rl.vtrace``) with π = the learner's
  current policy, and minimises −log π(a|x)·ρ^pg·A + c_v·½(v_s − V)² − β·H(π) with RMSProp, the learning rate
  annealed linearly to 0 over the training length, gradients clipped; then publishes the new parameters.
- Cost = environment steps consumed by the learner (T × envs per trajectory), so the budget and the evaluation
  points count the experience the learner used, as in the paper's "1 billion steps".

The network is ``ActorCritic`` — by default with the LSTM (the paper's IMPALA agent) and, with ``[rl.net] torso =
"resnet"``, the IMPALA ResNet torso (parts ``s1.conv``, ``s2.conv``, ``s3.conv``, ``linear``, ``lstm``).
Runs with actor processes are not bit-reproducible (the lag depends on timing); ``n_actors = 0`` is.
"""

from __future__ import annotations

import copy
import queue as queue_mod
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from modelward.core.config import StrictModel
from modelward.core.device import model_device
from modelward.errors import ModelwardError
from modelward.rl.checkpoint import RLCheckpoint
from modelward.rl.envs import env_seeds, make_vector_env
from modelward.rl.evaluate import CurveRecorder
from modelward.rl.nets import ActorCritic, State
from modelward.rl.vtrace import vtrace


class ImpalaConfig(StrictModel):
    """IMPALA hyper-parameters. Paper values (Espeholt et al. 2018, App. D/G, DMLab): unroll 100, batch 32, RMSProp
    decay 0.99 / ε 0.1 / momentum 0, baseline cost 0.5, entropy 0.0033–0.01, γ 0.99, gradient clip 40, ρ̄ = c̄ = 1,
    lr annealed to 0. The defaults below shrink unroll and batch for a CPU; our loss is a mean (not a sum) over
    the batch, hence the smaller RMSProp ε (as for A2C)."""

    n_actors: int = Field(2, ge=0)
    envs_per_actor: int = Field(4, ge=1)
    unroll_length: int = Field(20, ge=1)
    batch_size: int = Field(2, ge=1)  # trajectories per learner update
    queue_size: int = Field(4, ge=1)  # trajectories in flight: bounds the policy lag
    lstm: bool = True
    gamma: float = Field(0.99, ge=0.0, le=1.0)
    lr: float = Field(6e-4, gt=0.0)
    rms_alpha: float = Field(0.99, gt=0.0, lt=1.0)
    rms_eps: float = Field(1e-5, gt=0.0)
    entropy_coef: float = Field(0.01, ge=0.0)
    value_coef: float = Field(0.5, ge=0.0)
    max_grad_norm: float = Field(40.0, gt=0.0)
    rho_bar: float = Field(1.0, gt=0.0)
    c_bar: float = Field(1.0, gt=0.0)
    lam: float = Field(1.0, ge=0.0, le=1.0)
    anneal_lr: bool = True
    clip_rewards: bool = False


class _Actor:
    """Steps `n_envs` environments with its own copy of the network (the behaviour policy)."""

    def __init__(self, net: ActorCritic, env_id: str, cfg: ImpalaConfig, seed: int,
                 max_episode_steps: int | None) -> None:
        self.net = net
        self.cfg = cfg
        self.n = cfg.envs_per_actor
        self.venv = make_vector_env(env_id, self.n, seed, max_episode_steps)
        self.obs, _ = self.venv.reset(seed=env_seeds(seed, self.n))
        self.state = net.initial_state(self.n)
        self.starts = np.ones(self.n, dtype=np.float32)
        self.gen = torch.Generator().manual_seed(seed)
        self.version = -1

    def _masked(self, starts: np.ndarray) -> State:
        if self.state is None:
            return None
        keep = torch.as_tensor(1.0 - starts).view(1, -1, 1)
        return (self.state[0] * keep, self.state[1] * keep)

    @torch.no_grad()
    def unroll(self) -> dict[str, Any]:
        c, n, t_len = self.cfg, self.n, self.cfg.unroll_length
        obs_buf = np.empty((t_len + 1, *self.obs.shape), dtype=self.obs.dtype)
        starts = np.empty((t_len + 1, n), dtype=np.float32)
        actions = np.empty((t_len, n), dtype=np.int64)
        rewards = np.empty((t_len, n), dtype=np.float32)
        discounts = np.empty((t_len, n), dtype=np.float32)
        blogp = np.empty((t_len, n), dtype=np.float32)
        state0 = None if self.state is None else (self.state[0].clone(), self.state[1].clone())
        obs_buf[0], starts[0] = self.obs, self.starts
        for t in range(t_len):
            self.state = self._masked(self.starts)
            logits, _, self.state = self.net(torch.as_tensor(self.obs), self.state)
            logp = F.log_softmax(logits, -1)
            a = torch.multinomial(logp.exp(), 1, generator=self.gen).squeeze(1)
            nxt, r, term, trunc, info = self.venv.step(a.numpy())
            r = np.asarray(r, dtype=np.float32)
            if c.clip_rewards:
                r = np.clip(r, -1.0, 1.0)
            cut = np.logical_and(trunc, ~term)
            if cut.any():  # a time limit is not a terminal: bootstrap from the final observation's value
                idx = np.flatnonzero(cut)
                fin = torch.as_tensor(np.stack([info["final_obs"][i] for i in idx]))
                st = None if self.state is None else (self.state[0][:, idx], self.state[1][:, idx])
                r[idx] += c.gamma * self.net(fin, st)[1].numpy()
            done = np.logical_or(term, trunc)
            actions[t], rewards[t] = a.numpy(), r
            discounts[t] = c.gamma * (1.0 - done)
            blogp[t] = logp.gather(1, a.unsqueeze(1)).squeeze(1).numpy()
            self.obs, self.starts = nxt, done.astype(np.float32)
            obs_buf[t + 1], starts[t + 1] = self.obs, self.starts
        return {"obs": obs_buf, "starts": starts, "actions": actions, "rewards": rewards, "discounts": discounts,
                "behaviour_logp": blogp, "state0": None if state0 is None else (state0[0].numpy(),
                                                                                state0[1].numpy()),
                "version": self.version}

    def close(self) -> None:
        self.venv.close()


def _actor_main(shared: ActorCritic, version: Any, lock: Any, out: Any, stop: Any, env_id: str,
                cfg: ImpalaConfig, seed: int, max_episode_steps: int | None) -> None:
    """An actor process: refresh the behaviour policy from shared memory when it changed, unroll, send."""
    torch.set_num_threads(1)
    actor = _Actor(copy.deepcopy(shared), env_id, cfg, seed, max_episode_steps)
    try:
        while not stop.is_set():
            if version.value != actor.version:
                with lock:
                    actor.net.load_state_dict(shared.state_dict())
                    actor.version = version.value
            traj = actor.unroll()
            while not stop.is_set():
                try:
                    out.put(traj, timeout=0.2)
                    break
                except queue_mod.Full:
                    continue
    finally:
        actor.close()


def _batch(trajs: list[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate trajectories along the environment axis (time-major [T(+1), B·N, ...])."""
    b = {k: torch.as_tensor(np.concatenate([t[k] for t in trajs], axis=1))
         for k in ("obs", "starts", "actions", "rewards", "discounts", "behaviour_logp")}
    if trajs[0]["state0"] is None:
        b["state0"] = None
    else:
        b["state0"] = tuple(torch.as_tensor(np.concatenate([t["state0"][i] for t in trajs], axis=1))
                            for i in range(2))
    return b


def _to_device(b: dict[str, Any], dev: torch.device) -> dict[str, Any]:
    """The learner's batch on its device (a no-op on the CPU)."""
    if dev.type == "cpu":
        return b
    out = {k: v.to(dev, non_blocking=True) for k, v in b.items() if k != "state0"}
    out["state0"] = None if b["state0"] is None else tuple(s.to(dev) for s in b["state0"])
    return out


def impala_loss(net: ActorCritic, b: dict[str, Any], cfg: ImpalaConfig) -> torch.Tensor:
    """The learner's loss on one batch: V-trace policy gradient + baseline + entropy bonus (IMPALA §4.2)."""
    t_len = b["actions"].shape[0]
    logits, values = net.unroll(b["obs"], b["state0"], b["starts"])  # T+1 steps: the last gives the bootstrap
    logp_all = F.log_softmax(logits[:t_len], -1)
    target_logp = logp_all.gather(-1, b["actions"].unsqueeze(-1)).squeeze(-1)
    vt = vtrace(b["behaviour_logp"], target_logp.detach(), b["rewards"], values[:t_len].detach(),
                values[t_len].detach(), b["discounts"], cfg.rho_bar, cfg.c_bar, cfg.rho_bar, cfg.lam)
    pg = -(target_logp * vt.pg_advantages).mean()
    baseline = 0.5 * (vt.vs - values[:t_len]).pow(2).mean()
    entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
    return pg + cfg.value_coef * baseline - cfg.entropy_coef * entropy


def train_impala(net: ActorCritic, env_id: str, cfg: ImpalaConfig, seed: int, steps: int,
                 recorder: CurveRecorder, trainable: set[str] | None = None,
                 max_episode_steps: int | None = None, stats: dict[str, Any] | None = None,
                 checkpoint: RLCheckpoint | None = None) -> list[tuple[int, float]]:
    """Train `net` in place with IMPALA for `steps` environment steps consumed by the learner; returns the curve.

    Args: net (``ActorCritic``, recurrent or not), env_id, cfg, seed (actor k uses a seed derived from it), steps,
    recorder, trainable (T2: the only parameters optimised; actors still act with the whole net),
    max_episode_steps, stats (filled with ``lags`` — learner version minus the behaviour version of every
    trajectory used — ``updates`` and ``trajectories``), checkpoint (``rl.checkpoint``: the learner's state is saved at
    the boundaries and a restarted run resumes from it; the actors restart with environments and seeds derived from
    (seed, step) — at every boundary too when ``n_actors = 0``, which makes that resume bit-identical; with actor
    processes the resumed run is a valid continuation, not identical, as runs with actors never are).
    Example: ``train_impala(ActorCritic(spec, recurrent=True), "MinAtar/Breakout-v1", ImpalaConfig(), 0, 50_000, rec)``
    """
    params = [p for n, p in net.named_parameters() if trainable is None or n in trainable]
    for n, p in net.named_parameters():
        p.requires_grad_(trainable is None or n in trainable)
    opt = torch.optim.RMSprop(params, lr=cfg.lr, alpha=cfg.rms_alpha, eps=cfg.rms_eps)
    stats = stats if stats is not None else {}
    stats.update({"lags": [], "updates": 0, "trajectories": 0})
    per_traj = cfg.unroll_length * cfg.envs_per_actor
    resumed = checkpoint.load(recorder, {"net": net}, opt, {}, {}) if checkpoint else None
    cost = last_ck = 0 if resumed is None else int(resumed[0]["cost"])
    version_n = 0 if resumed is None else int(resumed[0]["counters"]["version"])

    def seeds_at(c: int) -> list[int]:  # the actors' seeds; after a checkpoint boundary derived from (seed, c)
        base = seed if c == 0 else int(np.random.SeedSequence([seed, c]).generate_state(1)[0])
        return [int(s) for s in np.random.SeedSequence(base).generate_state(max(1, cfg.n_actors))]

    actor_seeds = seeds_at(cost)
    procs: list[Any] = []
    local: _Actor | None = None
    dev = model_device(net)  # the learner's device; actors always act with a CPU copy (synced after each update)
    behaviour = net if dev.type == "cpu" else copy.deepcopy(net).cpu().requires_grad_(False)
    try:
        if cfg.n_actors == 0:
            local = _Actor(behaviour, env_id, cfg, actor_seeds[0], max_episode_steps)
            local.version = 0

            def next_traj() -> dict[str, Any]:
                local.version = version_n
                return local.unroll()
        else:
            import torch.multiprocessing as tmp

            ctx = tmp.get_context("spawn")
            shared = copy.deepcopy(net).cpu().requires_grad_(False).share_memory()
            version, lock = ctx.Value("i", 0), ctx.Lock()
            q, stop = ctx.Queue(maxsize=cfg.queue_size), ctx.Event()
            for k in range(cfg.n_actors):
                p = ctx.Process(target=_actor_main, daemon=True,
                                args=(shared, version, lock, q, stop, env_id, cfg, actor_seeds[k],
                                      max_episode_steps))
                p.start()
                procs.append(p)

            def next_traj() -> dict[str, Any]:
                while True:
                    try:
                        return q.get(timeout=1.0)
                    except queue_mod.Empty:
                        dead = [p for p in procs if not p.is_alive()]
                        if dead:
                            raise ModelwardError(f"IMPALA actor process exited with code {dead[0].exitcode}; "
                                                 "see its traceback above") from None

        if resumed is None and recorder.start():
            return recorder.finish(cost)
        while cost < steps:
            if cfg.anneal_lr:
                for gr in opt.param_groups:
                    gr["lr"] = cfg.lr * max(0.0, 1.0 - cost / steps)
            trajs = [next_traj() for _ in range(cfg.batch_size)]
            stats["lags"] += [version_n - t["version"] for t in trajs]
            stats["trajectories"] += len(trajs)
            loss = impala_loss(net, _to_device(_batch(trajs), dev), cfg)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            opt.step()
            version_n += 1
            stats["updates"] = version_n
            if behaviour is not net:  # the in-process actor's CPU copy follows the learner
                with torch.no_grad():
                    for sp, p in zip(behaviour.parameters(), net.parameters(), strict=True):
                        sp.copy_(p.detach())
            if procs:
                with lock:
                    for sp, p in zip(shared.parameters(), net.parameters(), strict=True):
                        sp.copy_(p.detach())
                    version.value = version_n
            cost += per_traj * len(trajs)
            if recorder.step(cost):
                break
            if checkpoint is not None and checkpoint.due(cost, last_ck, recorder):
                last_ck = cost
                if local is not None:  # the in-process actor restarts from (seed, cost) in every run
                    local.close()
                    local = _Actor(behaviour, env_id, cfg, seeds_at(cost)[0], max_episode_steps)
                checkpoint.save(cost, recorder, {"net": net}, opt, {}, {}, {"version": version_n})
        return recorder.finish(cost)
    finally:
        if local is not None:
            local.close()
        if procs:
            stop.set()
            deadline = time.monotonic() + 10.0
            while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
                try:  # drain so that actors blocked on a full queue see the stop signal
                    q.get(timeout=0.05)
                except queue_mod.Empty:
                    pass
            for p in procs:
                p.join(timeout=1.0)
                if p.is_alive():
                    p.terminate()
                    p.join()
        for p in net.parameters():
            p.requires_grad_(True)
