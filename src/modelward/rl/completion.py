"""The reinforcement-learning completion problem (seed 000 §3–§5, App. A, C.3–C.5).

How the completion study uses it (``modelward.completion.study``):
- ``RLProblem.from_study(study_cfg)`` validates the study's raw ``[rl]`` table as ``RLConfig``.
- ``problem.tasks`` are the games (one env id, a named suite or an explicit list). One agent is trained per
  (seed, game); MC-hardness is computed per game and averaged over the games within each seed, then the statistics
  are taken over seeds (the study does that aggregation; digest §2.3 "multi-task RL aggregation").
- cost = environment steps (summed over parallel envs; an Atari step is 4 frames); L = −(mean episodic return) over
  ``eval_episodes`` fixed-seed evaluation episodes, recorded at cost 0 and every ``eval_every`` steps.
- ``train_original`` saves the agent (safetensors) and, for DQN, its replay buffer (safetensors);
  ``OriginalRun.extras`` = {"replay_buffer": path or "", "random_loss": L of a uniform random policy,
  "final_loss": L(θ_N)}.
- ``retrain`` resets the part (``modelward.completion.procedures.prepare_retraining``: T1–T4) and trains with the same
  agent hyper-parameters (App. A: kept the same in retraining); for DQN ``procedure.keep_buffer`` True starts from
  the trained agent's buffer, False/None from an empty one.
- Filtering games "no better than random" (App. A: 13 A3C games, 3 Rainbow games excluded): the study calls
  ``problem.usable(original)``, True iff ``random_loss(task) − L(θ_N) > min_gain`` (or filtering is off). The
  report can list the filtered games with ``problem.random_loss(task)`` and the run's final loss.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field

from modelward.completion.problem import CompletionProblem, Curve, OnEval, OriginalRun, ProcedureSpec
from modelward.completion.procedures import prepare_retraining, stable_seed
from modelward.core.config import StrictModel, validate
from modelward.core.init import InitScheme, init_model_
from modelward.core.io import load_state_dict, save_state_dict
from modelward.core.parts import parts_table, resolve_part
from modelward.errors import ConfigError
from modelward.rl.a2c import A2CConfig, ac_policy, train_a2c
from modelward.rl.dqn import DQNConfig, q_policy, train_dqn
from modelward.rl.envs import EnvSpec, env_spec, resolve_games
from modelward.rl.evaluate import CurveRecorder, episode_returns, loss_from_returns, random_policy
from modelward.rl.nets import ActorCritic, NetConfig, QNetwork
from modelward.rl.replay import ReplayBuffer

DEFAULT_ENV = "MinAtar/Breakout-v1"


class RLConfig(StrictModel):
    """The ``[rl]`` table of a completion study."""

    env: str | None = None
    suite: str | None = None
    games: list[str] | None = None
    agent: Literal["a2c", "dqn", "recurrent"] = "a2c"
    net: NetConfig = NetConfig()
    a2c: A2CConfig = A2CConfig()
    dqn: DQNConfig = DQNConfig()
    steps: int = Field(100_000, ge=1)
    eval_every: int = Field(10_000, ge=1)
    eval_episodes: int = Field(10, ge=1)
    eval_seed: int = Field(100_000, ge=0)
    eval_max_steps: int = Field(1_000, ge=1)
    max_episode_steps: int | None = Field(10_000, ge=1)
    init: InitScheme = "glorot_uniform"
    filter_random: bool = True
    min_gain: float = 0.0
    torch_threads: int | None = Field(1, ge=1)


def _slug(task: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in task).strip("_") or "task"


class RLProblem(CompletionProblem):
    """One agent per (seed, game) trained by A2C / DQN / recurrent A2C; parts from ``ActorCritic``/``QNetwork``."""

    def __init__(self, cfg: RLConfig) -> None:
        self.cfg = cfg
        games = resolve_games(cfg.env, cfg.suite, cfg.games) if (cfg.env or cfg.suite or cfg.games) else [
            DEFAULT_ENV]
        self.tasks = games
        self._random: dict[str, float] = {}
        self._specs: dict[str, EnvSpec] = {}

    @classmethod
    def from_study(cls, study_cfg: Any) -> RLProblem:
        raw = getattr(study_cfg, "rl", None) or {}
        return cls(validate(RLConfig, dict(raw), "rl"))

    # -- building blocks ------------------------------------------------------------------------------------
    def spec(self, task: str) -> EnvSpec:
        if task not in self._specs:
            self._specs[task] = env_spec(task)
        return self._specs[task]

    def build(self, task: str | None = None) -> ActorCritic | QNetwork:
        spec = self.spec(task or self.tasks[0])
        if self.cfg.agent == "dqn":
            return QNetwork(spec, self.cfg.net, dueling=self.cfg.dqn.dueling)
        return ActorCritic(spec, self.cfg.net, recurrent=self.cfg.agent == "recurrent")

    def evaluate(self, net: torch.nn.Module, task: str) -> float:
        """L(θ) = −mean return over the fixed evaluation episodes."""
        c = self.cfg
        if isinstance(net, QNetwork):
            act = q_policy(net, self.spec(task).n_actions, c.dqn.eval_epsilon, c.eval_seed)
        else:
            act = ac_policy(net, c.eval_episodes, c.eval_seed)
        return loss_from_returns(episode_returns(act, task, c.eval_episodes, c.eval_seed, c.eval_max_steps))

    def random_loss(self, task: str) -> float:
        """L of the uniform random policy on the same evaluation episodes (the filter's reference)."""
        if task not in self._random:
            c = self.cfg
            act = random_policy(self.spec(task).n_actions, c.eval_seed)
            self._random[task] = loss_from_returns(
                episode_returns(act, task, c.eval_episodes, c.eval_seed, c.eval_max_steps))
        return self._random[task]

    def usable(self, original: OriginalRun) -> bool:
        """False for a game whose trained agent is no better than random (it is then left out of the averages)."""
        if not self.cfg.filter_random:
            return True
        final = float(original.extras.get("final_loss", original.curve[-1][1]))
        return self.random_loss(original.task) - final > self.cfg.min_gain

    def _train(self, net: torch.nn.Module, task: str, seed: int, steps: int, recorder: CurveRecorder,
               trainable: set[str] | None, buffer: ReplayBuffer | None, lr: float | None
               ) -> tuple[Curve, ReplayBuffer | None]:
        if self.cfg.torch_threads:
            torch.set_num_threads(self.cfg.torch_threads)
        if isinstance(net, QNetwork):
            dcfg = self.cfg.dqn if lr is None else self.cfg.dqn.model_copy(update={"lr": lr})
            return train_dqn(net, task, dcfg, seed, steps, recorder, buffer, trainable, self.cfg.max_episode_steps)
        acfg = self.cfg.a2c if lr is None else self.cfg.a2c.model_copy(update={"lr": lr})
        return train_a2c(net, task, acfg, seed, steps, recorder, trainable, self.cfg.max_episode_steps), None

    # -- protocol -------------------------------------------------------------------------------------------
    def part_names(self) -> list[str]:
        return list(self.build().part_names)

    def parts_table(self) -> list[dict[str, Any]]:
        return parts_table(self.build())

    def validate_part(self, part: str) -> None:
        resolve_part(self.build(), part)

    def train_original(self, seed: int, task: str, workdir: Path, on_eval: OnEval | None = None) -> OriginalRun:
        net = init_model_(self.build(task), self.cfg.init, seed)
        rec = CurveRecorder(lambda: self.evaluate(net, task), self.cfg.eval_every, None, on_eval)
        curve, buffer = self._train(net, task, stable_seed("original", seed, task), self.cfg.steps, rec, None,
                                    None, None)
        # absolute paths: the study stores a relative checkpoint path as relative to its output folder, so a
        # relative `--out` would otherwise be prefixed twice
        workdir = Path(workdir).resolve()
        stem = f"original_{_slug(task)}_seed{seed}"
        ckpt = workdir / f"{stem}.safetensors"
        save_state_dict(ckpt, net.state_dict(), {"seed": seed, "task": task, "agent": self.cfg.agent})
        replay = ""
        if buffer is not None:
            replay = str(workdir / f"{stem}_replay.safetensors")
            buffer.save(replay)
        extras = {"replay_buffer": replay, "random_loss": self.random_loss(task), "final_loss": curve[-1][1]}
        return OriginalRun(seed, task, curve, ckpt, extras)

    def retrain(self, original: OriginalRun, part: str, procedure: ProcedureSpec, seed: int, budget: int,
                stop_at: float | None, workdir: Path, on_eval: OnEval | None = None) -> Curve:
        if procedure.keep_buffer and self.cfg.agent != "dqn":
            raise ConfigError(f"procedure {procedure.name!r}: keep_buffer needs a replay-based agent "
                              f"(rl.agent = 'dqn'), not {self.cfg.agent!r}")
        task = original.task
        net = self.build(task)
        state, _ = load_state_dict(original.checkpoint)
        net.load_state_dict(state)
        # the seed ignores the procedure's name and buffer choice: "kept" and "reset" runs start from the same
        # re-initialised weights and see the same environment seeds (a paired comparison)
        shape = procedure.model_dump_json(exclude={"name", "keep_buffer"})
        rseed = stable_seed("retrain", seed, task, part, shape)
        trainable = prepare_retraining(net, part, procedure, torch.Generator().manual_seed(rseed))
        buffer = None
        if procedure.keep_buffer:
            path = original.extras.get("replay_buffer") or ""
            if not path:
                raise ConfigError(f"procedure {procedure.name!r}: keep_buffer, but the original run of {task!r} "
                                  "saved no replay buffer")
            buffer = ReplayBuffer.load(path)
        rec = CurveRecorder(lambda: self.evaluate(net, task), self.cfg.eval_every, stop_at, on_eval)
        curve, _ = self._train(net, task, rseed, int(budget), rec, trainable, buffer, procedure.lr)
        return curve
