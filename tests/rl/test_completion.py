"""RLProblem: config validation, train/retrain semantics, buffer kept vs reset, the random-agent filter."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from modelward.completion.problem import ProcedureSpec
from modelward.completion.rl import RLProblem
from modelward.core.io import load_state_dict
from modelward.errors import ConfigError, PartError
from modelward.rl.replay import ReplayBuffer

RL = {"env": "CartPole-v1", "agent": "dqn", "steps": 2_000, "eval_every": 1_000, "eval_episodes": 4,
      "eval_max_steps": 150, "dqn": {"lr": 1e-3, "learning_starts": 300, "target_update": 300,
                                     "eps_fraction": 0.3, "buffer_size": 4_000}}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    torch.set_num_threads(1)
    p = RLProblem.from_study(SimpleNamespace(rl=RL))
    d = tmp_path_factory.mktemp("rl")
    return p, p.train_original(0, p.tasks[0], d), d


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="rl: field 'agent'.*valid choices"):
        RLProblem.from_study(SimpleNamespace(rl={"agent": "ppo"}))
    with pytest.raises(ConfigError, match="rl: field 'dqn.lr'"):
        RLProblem.from_study(SimpleNamespace(rl={"dqn": {"lr": -1}}))
    p = RLProblem.from_study(SimpleNamespace(rl={}))
    assert p.tasks == ["MinAtar/Breakout-v1"] and p.part_names()[0] == "conv1"
    assert RLProblem.from_study(SimpleNamespace(rl={"suite": "minatar-fast"})).tasks[2].endswith("SpaceInvaders-v1")
    with pytest.raises(PartError, match="valid parts"):
        p.validate_part("conv9")


def test_original_run_curve_checkpoint_buffer(trained):
    p, orig, _ = trained
    assert [c for c, _ in orig.curve] == [0, 1_000, 2_000] and orig.loss0 == orig.curve[0][1]
    state, meta = load_state_dict(orig.checkpoint)
    assert meta["task"] == "CartPole-v1" and "linear.weight" in state
    assert len(ReplayBuffer.load(orig.extras["replay_buffer"])) >= 1_990
    assert orig.extras["random_loss"] == p.random_loss("CartPole-v1")
    assert p.usable(orig) == (p.random_loss("CartPole-v1") > orig.curve[-1][1])
    strict = RLProblem.from_study(SimpleNamespace(rl={**RL, "min_gain": 1e9}))
    assert not strict.usable(orig)
    assert RLProblem.from_study(SimpleNamespace(rl={**RL, "min_gain": 1e9, "filter_random": False})).usable(orig)


def test_retrain_resets_only_the_part_and_buffer_choice_matters(trained):
    p, orig, d = trained
    curves = {}
    fine = RLProblem.from_study(SimpleNamespace(rl={**RL, "eval_every": 200}))
    for keep in (True, False):
        proc = ProcedureSpec(name=f"T1-{keep}", kind="T1", keep_buffer=keep)
        curves[keep] = fine.retrain(orig, "linear", proc, 0, 1_000, None, d)
        assert curves[keep][0][0] == 0 and curves[keep][-1][0] == 1_000
    # same reset weights, same seeds: the only difference is the buffer — kept updates at once, reset waits for
    # learning_starts transitions, so the curves differ
    assert curves[True][0] == curves[False][0]
    assert curves[True] != curves[False]
    stop = p.retrain(orig, "fc1", ProcedureSpec(name="T1", kind="T1"), 0, 2_000, stop_at=1e9, workdir=d)
    assert stop == stop[:1] and stop[0][0] == 0


def test_keep_buffer_needs_a_replay_agent(trained):
    _, orig, d = trained
    a2c = RLProblem.from_study(SimpleNamespace(rl={"env": "CartPole-v1"}))
    with pytest.raises(ConfigError, match="keep_buffer"):
        a2c.retrain(orig, "fc1", ProcedureSpec(name="k", kind="T1", keep_buffer=True), 0, 10, None, d)


def test_relative_output_folder_round_trips_through_the_study(tmp_path, monkeypatch):
    """`complete run --out runs/x` passes a relative workdir: the stored original must still be found again."""
    from modelward.completion.study import original_from_result, record_original
    from modelward.core.ledger import RunLedger

    monkeypatch.chdir(tmp_path)
    out = Path("runs") / "x"  # relative, as typed on the command line
    (out / "checkpoints").mkdir(parents=True)
    tiny = {**RL, "steps": 100, "eval_every": 100, "eval_episodes": 1, "eval_max_steps": 20}
    p = RLProblem.from_study(SimpleNamespace(rl=tiny))
    run = p.train_original(0, p.tasks[0], out / "checkpoints")
    ledger = RunLedger(out / "ledger.sqlite")
    ledger.add("orig|CartPole-v1|0", {"kind": "orig"})
    back = original_from_result(out, record_original(out, ledger, run))
    assert Path(back.checkpoint).is_file() and Path(back.extras["replay_buffer"]).is_file()
    assert "linear.weight" in load_state_dict(back.checkpoint)[0]


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


# (file, agent, games, planned runs = games × seeds × (1 original + parts × procedures + the T0 reference))
RL_EXAMPLES = [("completion_minatar.toml", "a2c", 1, 3 * (1 + 6 * 2 + 1)),
               ("completion_minatar_dqn.toml", "dqn", 1, 3 * (1 + 4 * 4 + 1)),
               ("completion_minatar_suite.toml", "a2c", 3, 3 * 3 * (1 + 4 * 1 + 1)),
               ("completion_minatar_lstm.toml", "recurrent", 1, 3 * (1 + 7 * 1 + 1)),
               ("completion_cartpole.toml", "dqn", 1, 3 * (1 + 2 * 2 + 1)),
               ("completion_minatar_rainbow.toml", "rainbow", 1, 3 * (1 + 3 * 2 + 1)),
               ("completion_minatar_impala.toml", "impala", 1, 3 * (1 + 5 * 1 + 1))]


def test_every_rl_example_is_checked():
    rl_examples = {p.name for p in EXAMPLES.glob("*.toml") if 'kind = "rl"' in p.read_text()}
    assert rl_examples == {name for name, *_ in RL_EXAMPLES}


@pytest.mark.parametrize("name,agent,n_games,n_runs", RL_EXAMPLES)
def test_example_studies_validate_and_plan(name, agent, n_games, n_runs):
    from modelward.completion.study import load_study, make_problem, plan

    cfg = load_study(EXAMPLES / name)
    problem = make_problem(cfg)
    assert isinstance(problem, RLProblem) and problem.cfg.agent == agent
    assert len(problem.tasks) == n_games
    assert len(plan(cfg, problem)) == n_runs
    if agent in ("recurrent", "impala"):
        assert "lstm" in problem.part_names()
    if agent in ("dqn", "rainbow"):  # the replay-buffer study: every procedure kind comes kept and reset
        kinds = {(p.kind, p.keep_buffer) for p in cfg.procedures if p.keep_buffer is not None}
        assert {k for k, _ in kinds} == {k for k, keep in kinds if keep} == {k for k, keep in kinds if not keep}


def test_rainbow_and_impala_agents_and_one_game_list():
    rb = RLProblem.from_study(SimpleNamespace(rl={"agent": "rainbow", "rainbow": {"buffer_size": 100}}))
    net = rb.build()
    assert net.atoms == 51 and type(net.linear).__name__ == "NoisyLinear" and rb.q_cfg.lr == 6.25e-5
    im = RLProblem.from_study(SimpleNamespace(rl={"agent": "impala", "net": {"torso": "resnet"}}))
    assert im.part_names()[:3] == ["s1.conv", "s2.conv", "s3.conv"] and "lstm" in im.part_names()
    assert im.cfg.eval_max_steps is None  # full game by default
    with pytest.raises(ConfigError, match="rl: field 'rainbow.atoms'"):
        RLProblem.from_study(SimpleNamespace(rl={"agent": "rainbow", "rainbow": {"atoms": 1}}))


def test_select_tasks_decides_per_game_on_all_seeds(trained):
    from modelward.completion.problem import OriginalRun

    p, orig, _ = trained
    rnd = p.random_loss("CartPole-v1")

    def fake(seed, task, final):
        return OriginalRun(seed, task, [(0, 0.0), (10, final)], orig.checkpoint, {"final_loss": final})

    # seed 1's agent is worse than random, seed 0's much better: the game is kept for BOTH seeds (mean gain > 0)
    sel = p.select_tasks([fake(0, "CartPole-v1", rnd - 30), fake(1, "CartPole-v1", rnd + 10)])
    assert sel["CartPole-v1"]["keep"] and sel["CartPole-v1"]["gain"] == pytest.approx(10.0)
    assert sel["CartPole-v1"]["seeds"] == [0, 1]
    assert not p.select_tasks([fake(0, "CartPole-v1", rnd + 1)])["CartPole-v1"]["keep"]
