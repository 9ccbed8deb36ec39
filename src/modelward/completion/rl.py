"""The reinforcement-learning completion problem (seed 000 §3–§5, App. A, C.3–C.5).

How the completion study uses it (``modelward.completion.study``):
- ``RLProblem.from_study(study_cfg)`` validates the study's raw ``[rl]`` table as ``RLConfig``.
- agents (``rl.agent``): ``a2c`` (A3C's synchronous form), ``recurrent`` (A2C + LSTM), ``dqn`` (ε-greedy DQN with
  double/dueling/prioritized/n-step, table ``[rl.dqn]``), ``rainbow`` (the same code with noisy nets and the C51
  head, table ``[rl.rainbow]`` whose defaults are Hessel et al.'s, seed 000 App. A), ``impala`` (actor processes +
  V-trace learner, table ``[rl.impala]``; LSTM agent, ``[rl.net] torso = "resnet"`` for the IMPALA torso).
- ``problem.tasks`` are the games (one env id, a named suite or an explicit list). One agent is trained per
  (seed, game); MC-hardness is computed per game and averaged over the games within each seed, then the statistics
  are taken over seeds (the study does that aggregation; digest §2.3 "multi-task RL aggregation").
- cost = environment steps (summed over parallel envs; an Atari step is 4 frames); L = −(mean episodic return) over
  ``eval_episodes`` fixed-seed evaluation episodes, recorded at cost 0 and every ``eval_every`` steps. Evaluation
  episodes are the full game by default (``eval_max_steps = None``: ALE's own 108k-frame end for Atari, a
  registered time limit, else ``envs.UNBOUNDED_CAP`` steps for games that never end, e.g. MinAtar).
- ``train_original`` saves the agent (safetensors) and, for DQN, its replay buffer (safetensors);
  ``OriginalRun.extras`` = {"replay_buffer": path or "", "random_loss": L of a uniform random policy,
  "final_loss": L(θ_N)}.
- ``retrain`` resets the part (``modelward.completion.procedures.prepare_retraining``: T1–T4) and trains with the same
  agent hyper-parameters (App. A: kept the same in retraining); for DQN/Rainbow ``procedure.keep_buffer`` True
  starts from the trained agent's buffer, False/None from an empty one. Exploration is not restarted: an ε-greedy
  agent retrains with ε = ``eps_end`` (``dqn.retrain_exploration = "continue"``), a noisy-net agent keeps the
  trained σ of the kept layers; only the from-scratch reference ``T0`` (every parameter re-initialised, empty
  buffer) runs the exploration schedule again.
- Filtering games "no better than random" (App. A: 13 A3C games, 3 Rainbow games excluded) is decided once per
  study, per game, on all of its original runs: ``select_tasks(originals)`` keeps a game iff the mean over seeds
  of ``random_loss(task) − L(θ_N)`` exceeds ``min_gain`` (or filtering is off). The same list holds for every seed
  and is listed in the report. ``usable(original)`` is the single-run test, kept for callers that only have one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field

from modelward.completion.problem import CompletionProblem, Curve, OnEval, OriginalRun, ProcedureSpec
from modelward.completion.procedures import ALL_PARTS, paired_seeds, prepare_retraining, stable_seed
from modelward.core.config import StrictModel, validate
from modelward.core.device import resolve_device
from modelward.core.init import InitScheme, init_model_
from modelward.core.io import load_into, load_state_dict, save_state_dict
from modelward.core.parts import parts_table, resolve_part
from modelward.errors import ConfigError
from modelward.rl.a2c import A2CConfig, ac_policy, train_a2c
from modelward.rl.checkpoint import RLCheckpoint
from modelward.rl.dqn import DQNConfig, RainbowConfig, build_q_network, q_policy, train_dqn
from modelward.rl.envs import EnvSpec, env_spec, episode_cap, resolve_games
from modelward.rl.evaluate import CurveRecorder, episode_returns, loss_from_returns, random_policy
from modelward.rl.impala import ImpalaConfig, train_impala
from modelward.rl.nets import ActorCritic, NetConfig, QNetwork
from modelward.rl.replay import ReplayBuffer

DEFAULT_ENV = "MinAtar/Breakout-v1"


class RLConfig(StrictModel):
    """The ``[rl]`` table of a completion study."""

    env: str | None = None
    suite: str | None = None
    games: list[str] | None = None
    agent: Literal["a2c", "dqn", "recurrent", "rainbow", "impala"] = "a2c"
    net: NetConfig = NetConfig()
    a2c: A2CConfig = A2CConfig()
    dqn: DQNConfig = DQNConfig()
    rainbow: RainbowConfig = RainbowConfig()
    impala: ImpalaConfig = ImpalaConfig()
    steps: int = Field(100_000, ge=1)
    eval_every: int = Field(10_000, ge=1)
    eval_episodes: int = Field(10, ge=1)
    eval_seed: int = Field(100_000, ge=0)
    eval_max_steps: int | None = Field(None, ge=1)  # None = the full game (see the module docstring)
    max_episode_steps: int | None = Field(None, ge=1)  # training episodes; None = the full game, as above
    init: InitScheme = "glorot_uniform"
    filter_random: bool = True
    min_gain: float = 0.0
    torch_threads: int | None = Field(1, ge=1)
    checkpoint_buffer: bool = True  # mid-run checkpoints (study `checkpoint_every`) include the replay buffer


def _slug(task: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in task).strip("_") or "task"


class RLProblem(CompletionProblem):
    """One agent per (seed, game) trained by A2C / DQN / recurrent A2C; parts from ``ActorCritic``/``QNetwork``."""

    def __init__(self, cfg: RLConfig, checkpoint_every: int | None = None) -> None:
        self.cfg = cfg
        self.checkpoint_every = checkpoint_every  # env steps; see rl.checkpoint
        games = resolve_games(cfg.env, cfg.suite, cfg.games) if (cfg.env or cfg.suite or cfg.games) else [
            DEFAULT_ENV]
        self.tasks = games
        self._random: dict[str, float] = {}
        self._specs: dict[str, EnvSpec] = {}
        # where the agents learn (the study's device): A2C / DQN / Rainbow also act there; IMPALA's actors act
        # with CPU copies of the learner's weights (shared memory), synced after every update (docs/devices.md)
        self.device = "cpu"

    @classmethod
    def from_study(cls, study_cfg: Any) -> RLProblem:
        raw = getattr(study_cfg, "rl", None) or {}
        problem = cls(validate(RLConfig, dict(raw), "rl"), getattr(study_cfg, "checkpoint_every", None))
        problem.device = getattr(study_cfg, "device", "cpu")
        return problem

    # -- building blocks ------------------------------------------------------------------------------------
    def spec(self, task: str) -> EnvSpec:
        if task not in self._specs:
            self._specs[task] = env_spec(task)
        return self._specs[task]

    @property
    def q_cfg(self) -> DQNConfig:
        """The value-based agent's table: ``[rl.rainbow]`` for ``agent = "rainbow"``, else ``[rl.dqn]``."""
        return self.cfg.rainbow if self.cfg.agent == "rainbow" else self.cfg.dqn

    @property
    def replay_based(self) -> bool:
        return self.cfg.agent in ("dqn", "rainbow")

    def build(self, task: str | None = None) -> ActorCritic | QNetwork:
        spec = self.spec(task or self.tasks[0])
        if self.replay_based:
            return build_q_network(spec, self.cfg.net, self.q_cfg)
        recurrent = self.cfg.agent == "recurrent" or (self.cfg.agent == "impala" and self.cfg.impala.lstm)
        return ActorCritic(spec, self.cfg.net, recurrent=recurrent)

    def _eval_cap(self, task: str) -> int | None:
        return episode_cap(task, self.cfg.eval_max_steps)

    def evaluate(self, net: torch.nn.Module, task: str) -> float:
        """L(θ) = −mean return over the fixed evaluation episodes."""
        c = self.cfg
        if isinstance(net, QNetwork):
            act = q_policy(net, self.spec(task).n_actions, self.q_cfg.eval_epsilon, c.eval_seed)
        else:
            act = ac_policy(net, c.eval_episodes, c.eval_seed)
        return loss_from_returns(episode_returns(act, task, c.eval_episodes, c.eval_seed, self._eval_cap(task)))

    def random_loss(self, task: str) -> float:
        """L of the uniform random policy on the same evaluation episodes (the filter's reference)."""
        if task not in self._random:
            c = self.cfg
            act = random_policy(self.spec(task).n_actions, c.eval_seed)
            self._random[task] = loss_from_returns(
                episode_returns(act, task, c.eval_episodes, c.eval_seed, self._eval_cap(task)))
        return self._random[task]

    def _gain(self, original: OriginalRun) -> float:
        final = float(original.extras.get("final_loss", original.curve[-1][1]))
        return self.random_loss(original.task) - final

    def usable(self, original: OriginalRun) -> bool:
        """Single-run test: False for an agent no better than random. Studies use ``select_tasks`` instead."""
        return not self.cfg.filter_random or self._gain(original) > self.cfg.min_gain

    def select_tasks(self, originals: list[OriginalRun]) -> dict[str, dict[str, Any]]:
        """The study's one game list, decided on all original runs of each game (App. A: "we removed the following
        levels due to poor behaviour of the trained agent"): per task ``{"keep", "gain", "random", "seeds"}`` where
        gain = mean over its seeds of L(random) − L(θ_N); kept iff gain > ``min_gain`` or filtering is off."""
        by_task: dict[str, list[OriginalRun]] = {}
        for o in originals:
            by_task.setdefault(o.task, []).append(o)
        out = {}
        for task, runs in by_task.items():
            gain = sum(self._gain(o) for o in runs) / len(runs)
            out[task] = {"keep": (not self.cfg.filter_random) or gain > self.cfg.min_gain, "gain": gain,
                         "random": self.random_loss(task), "seeds": sorted(o.seed for o in runs)}
        return out

    def _train(self, net: torch.nn.Module, task: str, seed: int, steps: int, recorder: CurveRecorder,
               trainable: set[str] | None, buffer: ReplayBuffer | None, lr: float | None,
               from_scratch: bool = True, progress_file: Path | None = None) -> tuple[Curve, ReplayBuffer | None]:
        """One training run; with the study's ``checkpoint_every`` its state goes to `progress_file` at the
        checkpoint boundaries, a restarted run resumes from it (bit-identical on the CPU, ``rl.checkpoint``) and the
        file is removed at the end. IMPALA with actor processes resumes, but not bit-identically."""
        ck = None
        if self.checkpoint_every is not None and progress_file is not None:
            ck = RLCheckpoint(progress_file, self.checkpoint_every, self.cfg.checkpoint_buffer)
        out = self._train_once(net, task, seed, steps, recorder, trainable, buffer, lr, from_scratch, ck)
        if ck is not None:
            progress_file.unlink(missing_ok=True)  # type: ignore[union-attr]
        return out

    def _train_once(self, net: torch.nn.Module, task: str, seed: int, steps: int, recorder: CurveRecorder,
                    trainable: set[str] | None, buffer: ReplayBuffer | None, lr: float | None,
                    from_scratch: bool, ck: RLCheckpoint | None) -> tuple[Curve, ReplayBuffer | None]:
        if self.cfg.torch_threads:
            torch.set_num_threads(self.cfg.torch_threads)
        cap = episode_cap(task, self.cfg.max_episode_steps)
        upd = {} if lr is None else {"lr": lr}
        net.to(resolve_device(self.device))  # initialised / reset on the CPU, trained on the device
        if isinstance(net, QNetwork):
            dcfg = self.q_cfg.model_copy(update=upd)
            keep = not from_scratch and dcfg.retrain_exploration == "continue"
            return train_dqn(net, task, dcfg, seed, steps, recorder, buffer, trainable, cap,
                             exploration="final" if keep else "schedule", checkpoint=ck)
        if self.cfg.agent == "impala":
            return train_impala(net, task, self.cfg.impala.model_copy(update=upd), seed, steps, recorder,
                                trainable, cap, checkpoint=ck), None
        acfg = self.cfg.a2c.model_copy(update=upd)
        return train_a2c(net, task, acfg, seed, steps, recorder, trainable, cap, checkpoint=ck), None

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
        # absolute paths: the study stores a relative checkpoint path as relative to its output folder, so a
        # relative `--out` would otherwise be prefixed twice
        workdir = Path(workdir).resolve()
        stem = f"original_{_slug(task)}_seed{seed}"
        curve, buffer = self._train(net, task, stable_seed("original", seed, task), self.cfg.steps, rec, None,
                                    None, None, progress_file=workdir / f"{stem}.progress.safetensors")
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
        if procedure.keep_buffer and not self.replay_based:
            raise ConfigError(f"procedure {procedure.name!r}: keep_buffer needs a replay-based agent "
                              f"(rl.agent = 'dqn' or 'rainbow'), not {self.cfg.agent!r}")
        if procedure.keep_buffer and procedure.from_scratch:
            raise ConfigError(f"procedure {procedure.name!r}: T0 trains from scratch, it cannot keep the buffer")
        task = original.task
        net = self.build(task)
        state, _ = load_state_dict(original.checkpoint)
        load_into(net, state, original.checkpoint)
        # paired seeds: every procedure of retraining seed `seed` sees the same environment seeds and exploration
        # draws, and every procedure resetting `part` starts from the same re-initialised weights
        tseed, iseed = paired_seeds(seed, task, ALL_PARTS if procedure.from_scratch else part)
        trainable = prepare_retraining(net, part, procedure, torch.Generator().manual_seed(iseed))
        buffer = None
        if procedure.keep_buffer:
            path = original.extras.get("replay_buffer") or ""
            if not path:
                raise ConfigError(f"procedure {procedure.name!r}: keep_buffer, but the original run of {task!r} "
                                  "saved no replay buffer")
            buffer = ReplayBuffer.load(path)
        rec = CurveRecorder(lambda: self.evaluate(net, task), self.cfg.eval_every, stop_at, on_eval)
        progress = (Path(workdir) / f"retrain_{_slug(task)}_{seed}_{stable_seed(part, procedure.name)}"
                    ".progress.safetensors")
        curve, _ = self._train(net, task, tseed, int(budget), rec, trainable, buffer, procedure.lr,
                               from_scratch=procedure.from_scratch, progress_file=progress)
        return curve
