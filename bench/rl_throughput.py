"""Environment steps per second of each agent on MinAtar, against a random policy stepping the same vector env.

Run:  nice .venv/bin/python bench/rl_throughput.py [--env MinAtar/Breakout-v1] [--steps 20000] [--threads 1]
Training only (no evaluation episodes); the ratio agent/random is the agent's overhead over bare env stepping.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from modelward.core.init import init_model_
from modelward.rl.a2c import A2CConfig, train_a2c
from modelward.rl.dqn import DQNConfig, train_dqn
from modelward.rl.envs import env_spec, make_vector_env
from modelward.rl.evaluate import CurveRecorder
from modelward.rl.nets import ActorCritic, QNetwork


def _random(env: str, n_envs: int, steps: int) -> float:
    venv = make_vector_env(env, n_envs, 0)
    venv.reset(seed=list(range(n_envs)))
    rng = np.random.default_rng(0)
    n = venv.single_action_space.n
    t = time.perf_counter()
    for _ in range(steps // n_envs):
        venv.step(rng.integers(0, n, size=n_envs))
    venv.close()
    return steps / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--env", default="MinAtar/Breakout-v1")
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    spec = env_spec(a.env)
    never = CurveRecorder(lambda: 0.0, 10**12)
    rows = []
    a2c = A2CConfig()
    for name, agent in (("a2c", "a2c"), ("recurrent a2c", "rec")):
        net = init_model_(ActorCritic(spec, recurrent=agent == "rec"), seed=0)
        t = time.perf_counter()
        train_a2c(net, a.env, a2c, 0, a.steps, CurveRecorder(lambda: 0.0, 10**12))
        rows.append((name, a2c.n_envs, a.steps / (time.perf_counter() - t)))
    dqn = DQNConfig(learning_starts=1_000)
    net = init_model_(QNetwork(spec), seed=0)
    t = time.perf_counter()
    train_dqn(net, a.env, dqn, 0, a.steps // 2, never)
    rows.append(("dqn (prioritized, 1 update / 4 steps)", dqn.n_envs, (a.steps // 2) / (time.perf_counter() - t)))
    print(f"{a.env}, {a.steps} env steps, torch threads {a.threads}")
    print(f"{'agent':40s} {'envs':>5s} {'steps/s':>9s} {'random steps/s':>15s} {'ratio':>6s}")
    for name, n_envs, sps in rows:
        base = _random(a.env, n_envs, a.steps)
        print(f"{name:40s} {n_envs:5d} {sps:9.0f} {base:15.0f} {sps / base:6.3f}")


if __name__ == "__main__":
    main()
