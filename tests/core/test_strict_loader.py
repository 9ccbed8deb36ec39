"""One strict checkpoint loader for every path (issue 37 item 4): core.io.load_into refuses a wrong dtype (F16, I64,
BOOL: never cast), a wrong shape and a wrong architecture, with a message that names the tensors and what the file
and the model hold (not torch's first line, "Error(s) in loading state_dict for X:", cut before its useful part).
One test per path family: core (zoo / gloro checkpoints), the guard (check and serve), assess, privacy, split."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from modelward.core.io import load_into, load_state_dict, save_state_dict
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError, DataError

CNN = ModelConfig(arch="cnn", channels=[4, 8], fc=16)
WRONG_DTYPES = {"F16": torch.float16, "I64": torch.int64, "BOOL": torch.bool}


def _cast(state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {k: (v > 0 if dtype == torch.bool else v.to(dtype)) if v.is_floating_point() else v
            for k, v in state.items()}


def _flat(e: BaseException) -> str:
    return " ".join(str(e).split())


@pytest.mark.parametrize("name", sorted(WRONG_DTYPES))
def test_a_wrong_dtype_is_refused_naming_both_dtypes(name):
    net = build_model(CNN, (1, 8, 8), 10)
    with pytest.raises(DataError) as e:
        load_into(build_model(CNN, (1, 8, 8), 10), _cast(net.state_dict(), WRONG_DTYPES[name]), "m.safetensors")
    assert str(WRONG_DTYPES[name]) in str(e.value) and "torch.float32" in str(e.value)


def test_a_wrong_architecture_names_every_problem_not_torchs_first_line():
    small = build_model(CNN, (1, 8, 8), 10)
    with pytest.raises(DataError) as e:  # same architecture, other widths
        load_into(build_model(ModelConfig(arch="cnn", channels=[8, 8], fc=16), (1, 8, 8), 10), small.state_dict(),
                  "m.safetensors")
    msg = _flat(e.value)
    assert "Error(s) in loading" not in msg and "SmallCNN" in msg
    assert "conv1.0.conv.weight is [4, 1, 3, 3] in the file, [8, 1, 3, 3] in the model" in msg, msg
    with pytest.raises(DataError) as e:  # another architecture: the names that differ, both ways
        load_into(build_model(ModelConfig(arch="mlp", hidden=[16, 16]), (1, 8, 8), 10), small.state_dict(), "m.st")
    msg = _flat(e.value)
    assert "missing from the file: fc2.weight" in msg and "the model does not have: conv1.0.conv.weight" in msg, msg
    assert "(+" in msg  # long lists are cut with a count, the message itself is not


def _gloro_file(tmp_path: Path) -> Path:
    from modelward.robustness.experiment import RobustConfig, build_net, save_model
    from modelward.robustness.gloro.layers import build_gloro_model

    cfg = RobustConfig()
    model = build_gloro_model(cfg.model.arch, (1, 8, 8), 10, cfg.model.activation, cfg.model.init, 0)
    net = build_net(model, (1, 8, 8), cfg.train, cfg.train.epsilon, 0)
    path = tmp_path / "gloro.safetensors"
    save_model(path, SimpleNamespace(model=model, net=net), cfg, (1, 8, 8), 10)  # type: ignore[arg-type]
    return path


def test_core_checkpoints_zoo_and_gloro_refuse_half_precision(tmp_path):
    """core.checkpoint (explain, assess, `modelward robust` models): zoo and gloro kinds."""
    from modelward.core.checkpoint import load_checkpoint

    net = build_model(CNN, (1, 8, 8), 10)
    meta = {"kind": "zoo", "model": CNN.model_dump(mode="json"), "input_shape": [1, 8, 8], "num_classes": 10}
    save_state_dict(tmp_path / "zoo.safetensors", _cast(net.state_dict(), torch.float16), meta)
    with pytest.raises(DataError, match="float16, the model expects torch.float32"):
        load_checkpoint(tmp_path / "zoo.safetensors")
    path = _gloro_file(tmp_path)
    tensors, gmeta = load_state_dict(path)
    save_state_dict(path, _cast(tensors, torch.float16), gmeta)
    with pytest.raises(DataError, match="float16, the model expects torch.float32"):
        load_checkpoint(path)


@pytest.fixture()
def guard_toml(tmp_path):
    from modelward.extraction.guard.process import write_guard_config

    return write_guard_config(tmp_path / "g", build_model(CNN, (1, 8, 8), 10), CNN, (1, 8, 8), 10,
                              keys={"strict-loader-key-0": None})


@pytest.mark.parametrize("name", sorted(WRONG_DTYPES))
def test_guard_check_and_serve_refuse_a_wrong_dtype(guard_toml, name, capsys):
    """The issue's finding: F16, I64 and BOOL checkpoints passed `guard check` and `guard serve`."""
    from modelward.cli.main import main
    from modelward.extraction.guard.http import serve

    ckpt = guard_toml.parent / "model.safetensors"
    state, meta = load_state_dict(ckpt)
    save_state_dict(ckpt, _cast(state, WRONG_DTYPES[name]), meta)
    with pytest.raises(SystemExit) as e:
        main(["guard", "check", str(guard_toml)])
    err = _flat(capsys.readouterr().err)
    assert e.value.code == 2 and "model.checkpoint" in err and str(WRONG_DTYPES[name]) in err, err
    with pytest.raises(ConfigError, match="the model expects torch.float32"):
        serve(guard_toml, port=0)  # refused before it listens


def test_guard_refuses_a_checkpoint_of_another_architecture_with_the_shapes(guard_toml):
    from modelward.extraction.guard.service import build_service

    other = build_model(ModelConfig(arch="cnn", channels=[4, 8], fc=32), (1, 8, 8), 10)
    save_state_dict(guard_toml.parent / "model.safetensors", other.state_dict())
    with pytest.raises(ConfigError) as e:
        build_service(guard_toml, check_only=True)
    msg = _flat(e.value)
    assert msg.startswith("model.checkpoint:") and "fc1.weight is [32, 32] in the file, [16, 32] in the model" in msg, msg


def test_assess_refuses_a_wrong_shape_naming_the_tensors(tmp_path):
    from modelward.assess.config import AssessConfig
    from modelward.assess.target import load_target

    net = build_model(ModelConfig(arch="cnn", channels=[4, 8], fc=32), (1, 8, 8), 10)
    save_state_dict(tmp_path / "m.safetensors", net.state_dict())
    cfg = AssessConfig(name="m", checkpoint=str(tmp_path / "m.safetensors"), model=CNN)
    with pytest.raises(DataError) as e:
        load_target(cfg)
    assert "fc1.weight is [32, 32] in the file, [16, 32] in the model" in _flat(e.value)


def test_privacy_inversion_refuses_a_bool_checkpoint(tmp_path):
    from modelward.privacy.inspect_models import InvertConfig, _saved_model

    net = build_model(CNN, (1, 8, 8), 10)
    save_state_dict(tmp_path / "m.safetensors", _cast(net.state_dict(), torch.bool))
    cfg = InvertConfig(model_path=str(tmp_path / "m.safetensors"), model=CNN)
    with pytest.raises(DataError, match="torch.bool, the model expects torch.float32"):
        _saved_model(cfg, (1, 8, 8), 10)


def test_a_split_party_refuses_an_own_checkpoint_of_another_dtype(tmp_path):
    from modelward.governance.party.config import PartyConfig
    from modelward.governance.party.segment import Holding

    mcfg = ModelConfig(arch="mlp", hidden=[8, 8])
    full = build_model(mcfg, (4,), 3)
    save_state_dict(tmp_path / "bob.safetensors", _cast(full.state_dict(), torch.float16))
    cfg = PartyConfig(name="bob", layers=["fc2"], input_shape=[4], num_classes=3, model=mcfg, prev="alice",
                      next="carol", checkpoint_dir=str(tmp_path / "ck"), audit_db=str(tmp_path / "a.db"),
                      init={"checkpoint": str(tmp_path / "bob.safetensors")},
                      peers={p: {"fingerprint": "sha256:" + "0" * 64} for p in ("alice", "carol", "op")}, driver="op",
                      tls={"ca": "ca.pem", "cert": "bob.pem", "key": "bob.key"})
    with pytest.raises(ConfigError, match=r"init.checkpoint .*bob.safetensors: tensor 'fc2.weight' is torch.float16"):
        Holding(cfg)
