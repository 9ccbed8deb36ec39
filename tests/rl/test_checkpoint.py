"""Mid-run checkpoints of RL runs (rl.checkpoint): a crashed original run resumes to the uninterrupted curve."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from modelward.completion.rl import RLProblem
from modelward.core.io import load_metadata

BASE = {"env": "CartPole-v1", "steps": 400, "eval_every": 100, "eval_episodes": 2, "eval_max_steps": 40,
        "max_episode_steps": 60}
AGENTS = {
    # Rainbow: noisy nets (noise buffers + generator), C51, prioritized n-step replay saved with the checkpoint
    "rainbow": {"agent": "rainbow", "rainbow": {"n_envs": 2, "learning_starts": 100, "target_update": 100,
                                                "batch_size": 16, "buffer_size": 1_000, "atoms": 11}},
    "a2c": {"agent": "a2c", "a2c": {"n_envs": 4, "n_steps": 5}},
    # IMPALA with the in-process actor (n_actors = 0) and an LSTM agent: bit-identical; actor processes are not
    "impala": {"agent": "impala", "impala": {"n_actors": 0, "envs_per_actor": 2, "unroll_length": 5}},
}


class Crash(Exception):
    pass


def _problem(agent: str, every: int | None) -> RLProblem:
    return RLProblem.from_study(SimpleNamespace(rl={**BASE, **AGENTS[agent]}, checkpoint_every=every))


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_crashed_original_resumes_to_the_uninterrupted_curve(tmp_path: Path, agent: str) -> None:
    torch.set_num_threads(1)
    task = "CartPole-v1"
    ref = _problem(agent, 200).train_original(0, task, tmp_path / "ref")
    assert [c for c, _ in ref.curve] == [0, 100, 200, 300, 400]

    progress = tmp_path / "run" / "original_CartPole_v1_seed0.progress.safetensors"

    def crash(step: int, _loss: float) -> None:
        if step == 300:
            raise Crash

    with pytest.raises(Crash):
        _problem(agent, 200).train_original(0, task, tmp_path / "run", on_eval=crash)
    meta = json.loads(load_metadata(progress)["modelward_rl"])
    assert meta["cost"] == 200 and (meta["buffer"] is not None) == (agent == "rainbow")
    seen: list[int] = []
    resumed = _problem(agent, 200).train_original(0, task, tmp_path / "run", on_eval=lambda s, _l: seen.append(s))
    assert seen == [300, 400]  # continued from the checkpoint, not from the start
    assert resumed.curve == ref.curve  # bit-identical on the CPU
    assert not progress.exists()  # removed once the run finished
    if agent == "rainbow":
        from modelward.rl.replay import ReplayBuffer

        r0, r1 = ReplayBuffer.load(ref.extras["replay_buffer"]), ReplayBuffer.load(resumed.extras["replay_buffer"])
        assert len(r0) == len(r1) and (r0.obs == r1.obs).all()
