"""The RL loss L(θ) = E[−G] (seed 000 §3.1), estimated as −(mean episodic return) over evaluation episodes.

Evaluation episodes use fixed environment seeds (``seed + i``) at every evaluation — common random numbers, so two
curves of the same task are compared on the same episodes — and are stepped in one batch for speed. Episodes are
capped at ``max_steps`` (a truncated episode counts with the return it has so far; None = no cap beyond the
environment's own end).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from modelward.rl.envs import make_env

#: batched policy: act(obs[B,...], episode_indices[B]) -> actions[B]; the indices let a recurrent policy keep one
#: state per episode
ActFn = Callable[[np.ndarray, list[int]], np.ndarray]


def episode_returns(act: ActFn, env_id: str, episodes: int, seed: int, max_steps: int | None) -> list[float]:
    """Run `episodes` episodes in lock-step with the batched policy `act`; returns their returns."""
    envs = [make_env(env_id, max_episode_steps=max_steps) for _ in range(episodes)]
    try:
        obs = [e.reset(seed=seed + i)[0] for i, e in enumerate(envs)]
        returns = [0.0] * episodes
        live = list(range(episodes))
        while live:
            actions = act(np.stack([obs[i] for i in live]), live)
            still = []
            for a, i in zip(actions, live, strict=True):
                o, r, term, trunc, _ = envs[i].step(int(a))
                returns[i] += float(r)
                obs[i] = o
                if not (term or trunc):
                    still.append(i)
            live = still
        return returns
    finally:
        for e in envs:
            e.close()


def random_policy(n_actions: int, seed: int) -> ActFn:
    rng = np.random.default_rng(seed)

    def act(obs: np.ndarray, live: list[int]) -> np.ndarray:
        return rng.integers(0, n_actions, size=len(obs))

    return act


def loss_from_returns(returns: list[float]) -> float:
    """L = −mean return."""
    return -float(np.mean(returns))


class CurveRecorder:
    """Records the curve [(cost, L)]: L(θ₀) at cost 0, then at the first cost ≥ each multiple of `every`, and at
    the end; signals a stop at the first evaluation with L ≤ `stop_at` (retraining stops once it met ℓ*_α)."""

    def __init__(self, evaluate: Callable[[], float], every: int, stop_at: float | None = None,
                 on_eval: Callable[[int, float], None] | None = None) -> None:
        self.evaluate = evaluate
        self.every = max(1, int(every))
        self.stop_at = stop_at
        self.on_eval = on_eval
        self.curve: list[tuple[int, float]] = []
        self.next = self.every

    def _record(self, cost: int) -> bool:
        loss = float(self.evaluate())
        self.curve.append((int(cost), loss))
        if self.on_eval is not None:
            self.on_eval(int(cost), loss)
        return self.stop_at is not None and loss <= self.stop_at + 1e-12

    def start(self) -> bool:
        return self._record(0)

    def step(self, cost: int) -> bool:
        """Call after training advanced to `cost`; returns True when training should stop."""
        if cost < self.next:
            return False
        self.next = (cost // self.every + 1) * self.every
        return self._record(cost)

    def finish(self, cost: int) -> list[tuple[int, float]]:
        if self.curve[-1][0] != cost:
            self._record(cost)
        return self.curve
