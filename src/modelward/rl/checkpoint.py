"""Mid-run checkpoints of RL training runs (issue 11 item 3): an original or retraining run resumes after a crash.

What is saved (one safetensors file, JSON metadata; nothing is unpickled): every parameter and buffer of the agent's
networks (noise buffers of noisy nets included), the optimizer state, the cost (environment steps), the curve so
far, the training RNGs (torch generators as tensors, numpy generators as their JSON bit-generator state), the
loop's counters (exploration state: the ε schedule is a function of the cost, the noisy-net noise is in the
buffers and generator) and, with ``keep_buffer``, the replay buffer as tensors.

Environments cannot be serialised without pickle. So a run with checkpoints re-seeds its environments from
``(seed, cost)`` at every checkpoint boundary — in the uninterrupted run as well as in a resumed one — and a resumed
run continues from exactly the state the uninterrupted run had after that boundary: on the CPU its curve is
bit-identical. The price: every checkpoint boundary ends the episodes in flight (handled like a time-limit
truncation: bootstrapped, never treated as terminal), so a run with ``checkpoint_every`` differs from the same run
without it. Without ``keep_buffer`` a resumed DQN/Rainbow run restarts with the replay buffer the run started with
(empty for an original run) and is not identical to the uninterrupted one. Boundaries are the evaluation points
at or after each multiple of ``every`` (the agents' loops advance in rollouts of several env steps). IMPALA saves
the learner; its actors restart from (seed, step): bit-identical with ``n_actors = 0`` (the in-process actor is also
restarted at every boundary), not with actor processes (their timing decides the policy lag, and the trajectories
in flight at a crash are lost).

Example::

    ck = RLCheckpoint(Path("run.progress.safetensors"), every=10_000)
    curve = train_a2c(net, "CartPole-v1", A2CConfig(), 0, 50_000, recorder, checkpoint=ck)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from modelward.core.io import (
    load_metadata,
    load_tensors,
    optimizer_from_tensors,
    optimizer_to_tensors,
    save_tensors,
)
from modelward.rl.envs import env_seeds
from modelward.rl.evaluate import CurveRecorder
from modelward.rl.replay import ReplayBuffer


@dataclass(frozen=True)
class RLCheckpoint:
    """Where and how often an RL run saves its state.

    Args: path (the progress file), every (cost units = environment steps), keep_buffer (save the replay buffer).
    """

    path: Path
    every: int
    keep_buffer: bool = True

    def due(self, cost: int, last: int, recorder: CurveRecorder) -> bool:
        """A boundary: the recorder has just evaluated at `cost` and a multiple of `every` lies in (last, cost]."""
        return bool(recorder.curve) and recorder.curve[-1][0] == cost and cost // self.every > last // self.every

    @staticmethod
    def env_seeds(seed: int, cost: int, n: int) -> list[int]:
        """The environment seeds used after the boundary at `cost` (a pure function of (seed, cost))."""
        return env_seeds(int(np.random.SeedSequence([int(seed), int(cost)]).generate_state(1)[0]), n)

    def save(self, cost: int, recorder: CurveRecorder, nets: dict[str, torch.nn.Module],
             opt: torch.optim.Optimizer, gens: dict[str, torch.Generator], rngs: dict[str, np.random.Generator],
             counters: dict[str, Any], buffer: ReplayBuffer | None = None) -> None:
        opt_tensors, skeleton = optimizer_to_tensors(opt)
        tensors: dict[str, torch.Tensor] = dict(opt_tensors)
        for key, net in nets.items():
            for name, t in [*net.named_parameters(), *net.named_buffers()]:
                tensors[f"net.{key}.{name}"] = t
        for key, g in gens.items():
            tensors[f"gen.{key}"] = g.get_state()
        tensors["rng.torch"] = torch.get_rng_state()
        meta: dict[str, Any] = {"cost": int(cost), "curve": recorder.curve, "next": recorder.next,
                                "optimizer": skeleton, "counters": counters,
                                "rngs": {k: r.bit_generator.state for k, r in rngs.items()}, "buffer": None}
        if buffer is not None and self.keep_buffer:
            bt, bmeta = buffer.to_tensors()
            tensors.update({f"buffer.{k}": v for k, v in bt.items()})
            meta["buffer"] = bmeta
        save_tensors(self.path, tensors, {"modelward_rl": json.dumps(meta)})

    def load(self, recorder: CurveRecorder, nets: dict[str, torch.nn.Module], opt: torch.optim.Optimizer,
             gens: dict[str, torch.Generator], rngs: dict[str, np.random.Generator]
             ) -> tuple[dict[str, Any], ReplayBuffer | None] | None:
        """Restore a saved state into the given objects; returns (metadata, replay buffer or None), or None when
        there is no progress file."""
        if not Path(self.path).is_file():
            return None
        tensors = load_tensors(self.path)
        meta = json.loads(load_metadata(self.path)["modelward_rl"])
        with torch.no_grad():
            for key, net in nets.items():
                for name, t in [*net.named_parameters(), *net.named_buffers()]:
                    t.copy_(tensors[f"net.{key}.{name}"])
        optimizer_from_tensors(opt, {k: v for k, v in tensors.items() if k.startswith("opt.")}, meta["optimizer"])
        for key, g in gens.items():
            g.set_state(tensors[f"gen.{key}"])
        torch.set_rng_state(tensors["rng.torch"])
        for key, r in rngs.items():
            r.bit_generator.state = meta["rngs"][key]
        recorder.curve = [(int(c), float(v)) for c, v in meta["curve"]]
        recorder.next = int(meta["next"])
        buffer = None
        if meta["buffer"] is not None:
            buffer = ReplayBuffer.from_tensors({k[7:]: v for k, v in tensors.items() if k.startswith("buffer.")},
                                               meta["buffer"], str(self.path))
        return meta, buffer
