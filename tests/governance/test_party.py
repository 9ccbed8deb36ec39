"""The party state machine in-process (no transport): background checkpoints and the warm-up keep state exact."""

from pathlib import Path

import pytest
import torch

from modelward.core.data import DataConfig, load_data
from modelward.core.init import init_model_
from modelward.core.io import load_tensors
from modelward.core.train import TrainConfig, batch_order
from modelward.core.zoo import ModelConfig, build_model
from modelward.governance.demo import prepare_local_split
from modelward.governance.party import Party, PartyError, load_party_config
from modelward.governance.wire import Message, decode, encode


@pytest.fixture()
def two(tmp_path: Path):
    data = load_data(DataConfig(source="digits"))
    model = init_model_(build_model(ModelConfig(arch="cnn", channels=[4, 8], fc=16), (1, 8, 8), 10), seed=0)
    split = prepare_local_split(tmp_path, model, data, ["alice", "bob"], ["conv1"], checkpoint_every=2)
    a, b = (Party(load_party_config(split.party_configs[n])) for n in ("alice", "bob"))
    yield a, b, data
    for p in (a, b):
        p.audit.close()


def _step(a: Party, b: Party, s: int, idx: torch.Tensor, seq: list[int]) -> None:
    seq[0] += 1
    h = decode(a.handle("alice", encode(Message("forward", "s", s, seq[0], {"purpose": "train", "split": "train"},
                                                {"idx": idx})))).tensors["h"]
    seq[1] += 1
    g = decode(b.handle("alice", encode(Message("loss_backward", "s", s, seq[1], {"split": "train"},
                                                {"h": h, "idx": idx})))).tensors["g"]
    seq[0] += 1
    a.handle("alice", encode(Message("backward", "s", s, seq[0], {}, {"g": g})))


def test_background_checkpoint_holds_the_state_of_its_step_and_warm_up_changes_nothing(two):
    a, b, data = two
    tc = TrainConfig(batch_size=16, eval_batch_size=64, lr=0.1)
    before = {p.cfg.name: p.state_digest() for p in (a, b)}
    for p in (a, b):
        p.handle("alice", encode(Message("open", "s", meta={"train_cfg": tc.model_dump(mode="json")})))
        p._warm_up([7, 33])  # more shapes than the session needs: still no state change
        assert p._warm >= {7, 16, 33}
    # a fresh optimizer has no state yet, so the digest only covers parameters + buffers, which must be unchanged
    assert {p.cfg.name: p.state_digest() for p in (a, b)} == before
    it, seq = batch_order(len(data.x_train), 16, 0), [0, 0]
    _step(a, b, 0, next(it), seq)
    _step(a, b, 1, next(it), seq)  # step 2 reached: checkpoint written in the background
    at2 = {p.cfg.name: {k: v.clone() for k, v in p.segment.state_dict().items()} for p in (a, b)}
    _step(a, b, 2, next(it), seq)  # training goes on and changes the live tensors in place
    for p in (a, b):
        assert p.checkpoints() == [0, 2]  # listing waits for the write
        saved = load_tensors(p._ckpt_path(2))
        for k, v in at2[p.cfg.name].items():
            assert torch.equal(saved[f"model.{k}"], v), k
        assert not torch.equal(saved["model." + next(iter(p.params))], p.params[next(iter(p.params))].detach())


def test_a_failed_background_write_is_reported_before_the_next_pass_computes(two):
    a, b, data = two
    tc = TrainConfig(batch_size=16, eval_batch_size=64)
    for p in (a, b):
        p.handle("alice", encode(Message("open", "s", meta={"train_cfg": tc.model_dump(mode="json")})))
    b._ckpt_error = "checkpoint step_00000002.safetensors could not be written: OSError: disk full"
    digest = b.state_digest()
    idx = next(batch_order(len(data.x_train), 16, 0))
    h = decode(a.handle("alice", encode(Message("forward", "s", 0, 1, {"purpose": "train", "split": "train"},
                                                {"idx": idx})))).tensors["h"]
    with pytest.raises(PartyError, match="disk full"):
        b.handle("alice", encode(Message("loss_backward", "s", 0, 1, {"split": "train"}, {"h": h, "idx": idx})))
    assert b.state_digest() == digest and b.step == 0
    # reported once; the identical request then goes through
    b.handle("alice", encode(Message("loss_backward", "s", 0, 1, {"split": "train"}, {"h": h, "idx": idx})))
    assert b.step == 1


def test_port_in_use_is_a_config_error_not_a_traceback(two):
    # UAT: `party serve` started twice on the same port crashed with grpc's RuntimeError.
    import socket

    from modelward.errors import ConfigError
    from modelward.governance.party import PartyServer

    a, _, _ = two
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        a.cfg.port = s.getsockname()[1]
        with pytest.raises(ConfigError, match="in use"):
            PartyServer(a)
