"""Three parties in a chain (subprocesses): kill -9 the middle one mid-training, restart it, and check that the
driver resumed from the last common checkpoint and that the result equals monolithic training (no step lost or
applied twice)."""

import copy
import threading

import torch
from rich.console import Console

from modelward.core.data import DataConfig, load_data
from modelward.core.init import init_model_
from modelward.core.io import load_tensors
from modelward.core.train import TrainConfig, train
from modelward.core.zoo import ModelConfig, build_model
from modelward.governance.audit import verify
from modelward.governance.demo import prepare_local_split, run_split_demo
from modelward.governance.driver import SplitDriver
from modelward.governance.launch import start_party


def test_three_parties_survive_a_crash_and_match_monolithic(tmp_path):
    data = load_data(DataConfig(source="digits", seed=1))
    model = init_model_(build_model(ModelConfig(arch="mlp", hidden=[32, 16]), (1, 8, 8), 10), seed=4)
    reference = copy.deepcopy(model)
    split = prepare_local_split(tmp_path, model, data, ["alice", "carol", "bob"], ["fc1", "fc2"],
                                checkpoint_every=3, threads=1)
    tc = TrainConfig(steps=12, eval_every=4, batch_size=32, lr=0.05, optimizer="sgd")
    split.start()
    restarted = {}
    try:
        cfg = split.split_config(tc, seed=5, retry_s=60.0, timeout_s=20.0)

        def on_step(step, loss, links):
            if step == 7 and not restarted:  # carol has checkpoints at 0, 3, 6; alice/bob are at step 7
                carol = split.processes["carol"]
                carol.kill()
                restarted["t"] = threading.Thread(target=lambda: restarted.setdefault("p", start_party(
                    split.party_configs["carol"], carol.log, [f"port={carol.port}"])))
                restarted["t"].start()

        with SplitDriver(cfg) as drv:
            res = drv.train(on_step=on_step)
            exports = drv.checkpoint_all(export=True)
        restarted["t"].join()
        split.processes["carol"] = restarted["p"]
    finally:
        split.stop()
    assert res.resumes >= 1 and res.steps_run == 12
    mono = train(reference, data.x_train, data.y_train, data.x_test, data.y_test, tc, seed=5)
    state = {k: v for meta in exports.values() for k, v in load_tensors(meta["export"]).items()}
    for k, v in reference.state_dict().items():
        torch.testing.assert_close(state[k], v, atol=1e-5, rtol=1e-5, msg=k)
    assert [s for s, _ in res.curve] == [s for s, _ in mono.curve]
    for (_, a), (_, b) in zip(res.curve, mono.curve, strict=True):
        assert abs(a - b) < 1e-9
    for p in ("alice", "carol", "bob"):
        assert verify(tmp_path / p / "audit.db").ok


def test_demo_hook_trains_split_and_returns_the_full_model(tmp_path):
    data = load_data(DataConfig(source="digits", seed=0))
    model = init_model_(build_model(ModelConfig(arch="cnn", channels=[4, 8], fc=16), (1, 8, 8), 10), seed=2)
    reference = copy.deepcopy(model)
    tc = TrainConfig(steps=5, eval_every=2, batch_size=32)
    out = run_split_demo(tmp_path, model, data, tc, seed=1, console=Console(quiet=True))
    mono = train(reference, data.x_train, data.y_train, data.x_test, data.y_test, tc, seed=1)
    assert set(out.state_dict) == set(reference.state_dict())
    for k, v in reference.state_dict().items():
        torch.testing.assert_close(out.state_dict[k].to(v.dtype), v, atol=1e-5, rtol=1e-5, msg=k)
    assert [s for s, _ in out.curve] == [0, 2, 4, 5] and out.curve == mono.curve
    assert out.party_params["alice"] == [n for n, _ in reference.named_parameters() if n.startswith("conv1.")]
    assert out.summary["steps"] == 5 and out.summary["driver<->bob.bytes_sent"] > 0
