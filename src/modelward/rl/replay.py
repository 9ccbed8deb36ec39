"""Experience replay for the DQN-family agent (Rainbow ingredients: n-step returns, prioritized replay).

Transitions are stored already n-step-folded: (s_t, a_t, R = Σ_{k<m} γ^k r_{t+k}, s_{t+m}, discount = γ^m·(1−terminal)).
Prioritized sampling (Schaul et al. 2016): P(i) ∝ p_i^α through a sum tree, importance weights (N·P(i))^−β / max.
The whole buffer (contents, priorities, write position) saves to / loads from a safetensors file — never a pickle —
so that a retraining run can keep the trained agent's buffer (seed 000 §5, Rainbow "reset buffer = False").
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

import numpy as np
import torch

from modelward.core.io import load_state_dict, save_state_dict
from modelward.errors import DataError


class SumTree:
    """Binary tree of priorities; leaf i holds p_i, inner nodes the sums. O(log N) update and prefix search."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        size = 1
        while size < capacity:
            size *= 2
        self.size = size
        self.tree = np.zeros(2 * size, dtype=np.float64)

    def set(self, idx: np.ndarray, values: np.ndarray) -> None:
        j = np.atleast_1d(np.asarray(idx, dtype=np.int64)) + self.size
        if len(j) == 1:  # one new transition: a scalar walk up is much cheaper than numpy per level
            k, tree = int(j[0]), self.tree
            tree[k] = float(np.atleast_1d(values)[0])
            k //= 2
            while k >= 1:
                tree[k] = tree[2 * k] + tree[2 * k + 1]
                k //= 2
            return
        self.tree[j] = np.atleast_1d(values)
        j = np.unique(j // 2)
        while len(j) and j[0] >= 1:  # one tree level per iteration, all touched nodes at once
            self.tree[j] = self.tree[2 * j] + self.tree[2 * j + 1]
            if j[0] == 1:
                break
            j = np.unique(j // 2)

    def get(self, idx: np.ndarray) -> np.ndarray:
        return self.tree[np.asarray(idx) + self.size]

    @property
    def total(self) -> float:
        return float(self.tree[1])

    def find(self, prefix: np.ndarray) -> np.ndarray:
        """Leaf index whose cumulative range contains each prefix sum (vectorised over the batch)."""
        u = np.asarray(prefix, dtype=np.float64).copy()
        j = np.ones(len(u), dtype=np.int64)
        while j[0] < self.size:
            left = self.tree[2 * j]
            right = u >= left
            u = np.where(right, u - left, u)
            j = 2 * j + right
        return j - self.size


class ReplayBuffer:
    """Circular buffer of n-step transitions, uniform or prioritized sampling."""

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], obs_dtype: np.dtype, prioritized: bool = False,
                 alpha: float = 0.5) -> None:
        self.capacity = int(capacity)
        self.obs = np.zeros((capacity, *obs_shape), dtype=obs_dtype)
        self.next_obs = np.zeros((capacity, *obs_shape), dtype=obs_dtype)
        self.action = np.zeros(capacity, dtype=np.int64)
        self.reward = np.zeros(capacity, dtype=np.float32)
        self.discount = np.zeros(capacity, dtype=np.float32)
        self.pos = 0
        self.size = 0
        self.prioritized = prioritized
        self.alpha = alpha
        self.tree = SumTree(capacity) if prioritized else None
        self.max_priority = 1.0

    def __len__(self) -> int:
        return self.size

    def add(self, obs: np.ndarray, action: int, reward: float, next_obs: np.ndarray, discount: float) -> None:
        i = self.pos
        self.obs[i] = obs
        self.next_obs[i] = next_obs
        self.action[i] = action
        self.reward[i] = reward
        self.discount[i] = discount
        if self.tree is not None:
            self.tree.set(np.array([i]), np.array([self.max_priority ** self.alpha]))
        self.pos = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, batch: int, rng: np.random.Generator, beta: float = 0.4
               ) -> tuple[dict[str, torch.Tensor], np.ndarray]:
        """A batch of transitions (tensors) and their indices; ``weight`` holds the importance weights."""
        if self.size == 0:
            raise DataError("replay buffer is empty")
        if self.tree is None:
            idx = rng.integers(0, self.size, size=batch)
            w = np.ones(batch, dtype=np.float32)
        else:
            total = self.tree.total
            seg = total / batch
            prefix = (np.arange(batch) + rng.random(batch)) * seg  # stratified, as in Schaul et al.
            idx = np.minimum(self.tree.find(np.minimum(prefix, total * (1 - 1e-12))), self.size - 1)
            p = self.tree.get(idx) / total
            w = (self.size * np.maximum(p, 1e-12)) ** (-beta)
            w = (w / w.max()).astype(np.float32)
        out = {"obs": torch.as_tensor(self.obs[idx]), "next_obs": torch.as_tensor(self.next_obs[idx]),
               "action": torch.as_tensor(self.action[idx]), "reward": torch.as_tensor(self.reward[idx]),
               "discount": torch.as_tensor(self.discount[idx]), "weight": torch.as_tensor(w)}
        return out, idx

    def update_priorities(self, idx: np.ndarray, td_abs: np.ndarray) -> None:
        if self.tree is None:
            return
        p = np.abs(td_abs) + 1e-6
        self.max_priority = max(self.max_priority, float(p.max()))
        self.tree.set(idx, p ** self.alpha)

    # -- persistence -------------------------------------------------------------------------------------------
    def to_tensors(self) -> tuple[dict[str, torch.Tensor], dict]:
        """The filled part of the buffer as tensors + JSON metadata (safetensors files: saved buffers and
        mid-run checkpoints)."""
        n = self.size
        t = {"obs": torch.from_numpy(self.obs[:n].copy()), "next_obs": torch.from_numpy(self.next_obs[:n].copy()),
             "action": torch.from_numpy(self.action[:n].copy()),
             "reward": torch.from_numpy(self.reward[:n].copy()),
             "discount": torch.from_numpy(self.discount[:n].copy())}
        if self.tree is not None:
            t["priority"] = torch.from_numpy(self.tree.get(np.arange(n)).copy())
        meta = {"capacity": self.capacity, "pos": self.pos, "size": n, "prioritized": self.prioritized,
                "alpha": self.alpha, "max_priority": self.max_priority}
        return t, meta

    @classmethod
    def from_tensors(cls, t: dict[str, torch.Tensor], meta: dict, where: str = "replay buffer") -> ReplayBuffer:
        try:
            obs = t["obs"].numpy()
            buf = cls(int(meta["capacity"]), obs.shape[1:], obs.dtype, bool(meta["prioritized"]),
                      float(meta["alpha"]))
            n = int(meta["size"])
        except KeyError as e:
            raise DataError(f"{where}: not a replay buffer file (missing {e})") from None
        buf.obs[:n] = obs
        buf.next_obs[:n] = t["next_obs"].numpy()
        buf.action[:n] = t["action"].numpy()
        buf.reward[:n] = t["reward"].numpy()
        buf.discount[:n] = t["discount"].numpy()
        buf.size, buf.pos = n, int(meta["pos"])
        buf.max_priority = float(meta["max_priority"])
        if buf.tree is not None:
            buf.tree.set(np.arange(n), t["priority"].numpy())
        return buf

    def save(self, path: str | Path) -> None:
        t, meta = self.to_tensors()
        save_state_dict(path, t, meta)

    @classmethod
    def load(cls, path: str | Path) -> ReplayBuffer:
        t, meta = load_state_dict(path)
        return cls.from_tensors(t, meta, str(path))


class NStepFolder:
    """Turns one environment's transition stream into n-step transitions (flushes the tail at episode end)."""

    def __init__(self, n: int, gamma: float) -> None:
        self.n = n
        self.gamma = gamma
        self.q: deque[tuple[np.ndarray, int, float]] = deque()

    def push(self, obs: np.ndarray, action: int, reward: float, next_obs: np.ndarray, terminal: bool,
             done: bool) -> list[tuple[np.ndarray, int, float, np.ndarray, float]]:
        """Add one step; returns the n-step transitions that became complete. `terminal` = a true terminal
        state (no bootstrap); `done` = the episode ended (terminal or truncated)."""
        self.q.append((obs, action, reward))
        out = []
        if len(self.q) == self.n:
            out.append(self._fold(next_obs, terminal))
            self.q.popleft()
        if done:
            while self.q:
                out.append(self._fold(next_obs, terminal))
                self.q.popleft()
        return out

    def flush(self, next_obs: np.ndarray) -> list[tuple[np.ndarray, int, float, np.ndarray, float]]:
        """End the episode here as a truncation (bootstrapped from `next_obs`): the pending transitions."""
        out = []
        while self.q:
            out.append(self._fold(next_obs, False))
            self.q.popleft()
        return out

    def _fold(self, next_obs: np.ndarray, terminal: bool) -> tuple[np.ndarray, int, float, np.ndarray, float]:
        ret = 0.0
        for k, (_, _, r) in enumerate(self.q):
            ret += (self.gamma ** k) * r
        disc = 0.0 if terminal else self.gamma ** len(self.q)
        o, a, _ = self.q[0]
        return o, a, ret, next_obs, disc
