"""Issue 36 item 2 against real party processes under the shipped defaults: the slow poisoning of the issue (a
growing fraction of rows carrying other images' real activations; 0.978 → 0.283 in 30 attempts before) is stopped
by Bob's trend detector having cost him at most 2 points, Bob rolls back to his last good checkpoint, refuses to
train until his operator runs ``modelward party resume``, and the legitimate training then goes on.

Alice (data key, conv1) and Bob (the rest, the labels) are two ``party serve`` processes on 127.0.0.1 with mutual
TLS; the driver has its own control identity, "operator" — which the attacker also holds here (Alice's
organisation drives). Bob's policy is the shipped examples/policy_bob.toml and his PARTY.toml keeps its defaults
(label protection, integrity).
"""

import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from modelward.cli.party import app as party_app
from modelward.core.data import DataConfig, load_data
from modelward.core.init import init_model_
from modelward.core.io import load_tensors
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig, build_model
from modelward.governance.demo import prepare_local_split
from modelward.governance.driver import SplitDriver
from modelward.governance.party.config import TLSConfig
from modelward.governance.plan import segment_of
from modelward.governance.poisoning_audit import SlowPoisoning, slow_poisoning
from modelward.governance.protocol import PartyError
from modelward.governance.transport.client import GrpcPartyClient

EX = Path(__file__).resolve().parents[2] / "examples"
MODEL = ModelConfig(arch="cnn", channels=[16, 32], fc=64)  # the demo's
TC = TrainConfig(optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=1e-4, batch_size=64, steps=120, eval_every=120,
                 loss="error")
runner = CliRunner()


def _tls(root: Path, who: str) -> TLSConfig:
    return TLSConfig(ca=str(root / "certs/ca.pem"), cert=str(root / f"certs/{who}.pem"),
                     key=str(root / f"certs/{who}.key"))


@pytest.mark.slow
def test_slow_poisoning_is_stopped_within_two_points_and_the_run_resumes(tmp_path):
    data = load_data(DataConfig(source="digits", seed=0))
    model = init_model_(build_model(MODEL, (1, 8, 8), 10), "glorot_uniform", 0)
    bob_policy = tomllib.loads((EX / "policy_bob.toml").read_text())  # the shipped defaults
    split = prepare_local_split(tmp_path, model, data, ["alice", "bob"], ["conv1"], threads=1, exact=False,
                                driver="operator", policies={"bob": bob_policy, "alice": {
                                    "allow_peers": ["operator"], "training": True, "inference": True}})
    split.start()
    try:
        with SplitDriver(split.split_config(TC, seed=0, retry_s=0.0, timeout_s=120.0)) as drv:
            drv.train()
            exports = drv.checkpoint_all(export=True)
        full = build_model(MODEL, (1, 8, 8), 10)
        full.load_state_dict({k: v for m in exports.values() for k, v in load_tensors(m["export"]).items()})
        alice_part, bob_part = segment_of(full, ["conv1"]), segment_of(full, ["conv2", "fc1", "logits"])
        pin = split.split_config(TC, 0).parties[1].pin()
        address = split.processes["bob"].address
        data_key = GrpcPartyClient("bob", address, _tls(tmp_path, "alice"), pin, timeout=60)
        control_key = GrpcPartyClient("bob", address, _tls(tmp_path, "operator"), pin, timeout=60)
        try:
            rec = slow_poisoning(data_key, control_key, alice_part, bob_part, data, tmp_path / "bob/checkpoints",
                                 SlowPoisoning(attempts=40))
        finally:
            data_key.close()
            control_key.close()
        assert rec.accuracy_before > 0.95, rec
        assert rec.stopped and rec.stopped_at is not None and rec.stopped_at <= 15, rec
        assert rec.accuracy_at_stop >= rec.accuracy_before - 0.02, rec  # the target
        assert rec.accuracy_after >= rec.accuracy_before - 0.005 and rec.rolled_back_to <= TC.steps, rec
        log = (tmp_path / "bob/server.log").read_text()
        # the halt refuses the legitimate driver too, with the way on, until bob's operator lifts it
        with SplitDriver(split.split_config(TC.model_copy(update={"steps": 130}), seed=0, retry_s=0.0,
                                            timeout_s=120.0)) as drv, pytest.raises(PartyError,
                                                                                    match="party resume"):
            drv.train()
        r = runner.invoke(party_app, ["resume", str(split.party_configs["bob"])])
        assert r.exit_code == 0 and "halted the training" in r.output, r.output
        with SplitDriver(split.split_config(TC.model_copy(update={"steps": 130}), seed=0, retry_s=0.0,
                                            timeout_s=120.0)) as drv:
            res = drv.train()
        assert res.steps_run == 130 and 1.0 - res.curve[-1][1] > 0.95, res.curve
    finally:
        split.stop()
    assert "Traceback" not in log
