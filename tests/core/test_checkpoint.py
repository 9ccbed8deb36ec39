"""core.checkpoint: one reader dispatching on the ``kind`` metadata key (and the legacy keys of older files)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from modelward.core.checkpoint import CHECKPOINT_KINDS, checkpoint_kind, load_checkpoint, read_checkpoint
from modelward.core.io import save_state_dict, save_tensors
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import DataError


def _zoo(tmp_path: Path, kind: bool = True) -> tuple[Path, torch.nn.Module]:
    mcfg = ModelConfig(arch="mlp", hidden=[8])
    model = build_model(mcfg, (4,), 3).eval()
    meta = {"model": mcfg.model_dump(mode="json"), "input_shape": [4], "num_classes": 3}
    path = tmp_path / ("zoo.safetensors" if kind else "legacy.safetensors")
    save_state_dict(path, model.state_dict(), ({"kind": "zoo"} if kind else {}) | meta)
    return path, model


def test_zoo_checkpoints_with_and_without_the_kind_key(tmp_path: Path) -> None:
    x = torch.randn(5, 4)
    for kind in (True, False):
        path, model = _zoo(tmp_path, kind)
        ck = load_checkpoint(path)
        assert ck.kind == "zoo" and not ck.model.training and ck.wrapper is None
        assert torch.equal(ck.model(x), model(x))
    assert sorted(CHECKPOINT_KINDS) == ["gloro", "zoo"]


def test_gloro_checkpoint_gives_the_logit_model_and_the_net(tmp_path: Path) -> None:
    from modelward.robustness.experiment import RobustConfig, build_net, save_model
    from modelward.robustness.gloro import GloroNet
    from modelward.robustness.gloro.layers import build_gloro_model

    cfg = RobustConfig()
    model = build_gloro_model(cfg.model.arch, (1, 8, 8), 10, cfg.model.activation, cfg.model.init, 0)
    net = build_net(model, (1, 8, 8), cfg.train, cfg.train.epsilon, 0)
    save_model(tmp_path / "model.safetensors", SimpleNamespace(model=model, net=net), cfg, (1, 8, 8), 10)  # type: ignore[arg-type]
    tensors, meta = read_checkpoint(tmp_path)
    assert meta["kind"] == "gloro"
    del meta["kind"]
    assert checkpoint_kind(tensors, meta) == "gloro"  # a file written before the key existed
    ck = load_checkpoint(tmp_path)
    assert ck.kind == "gloro" and isinstance(ck.wrapper, GloroNet) and ck.model is ck.wrapper.f
    x = torch.rand(2, 1, 8, 8)
    assert torch.allclose(ck.model(x), model.eval()(x))
    with pytest.raises(DataError, match="expected 'zoo'"):
        load_checkpoint(tmp_path, kinds=("zoo",))


def test_hostile_and_broken_files_are_refused_with_a_clear_error(tmp_path: Path) -> None:
    path, model = _zoo(tmp_path)
    tensors, meta = read_checkpoint(path)
    save_state_dict(tmp_path / "odd.safetensors", tensors, meta | {"kind": "pickle"})
    with pytest.raises(DataError, match=r"known kinds: \['gloro', 'zoo'\]"):
        load_checkpoint(tmp_path / "odd.safetensors")
    save_state_dict(tmp_path / "bad.safetensors", {k: v[:1] for k, v in tensors.items()}, meta)
    with pytest.raises(DataError, match="do not match the model"):
        load_checkpoint(tmp_path / "bad.safetensors")
    save_tensors(tmp_path / "bare.safetensors", {"w": torch.zeros(2)})
    with pytest.raises(DataError, match="no architecture"):
        load_checkpoint(tmp_path / "bare.safetensors")
    (tmp_path / "evil.pt").write_bytes(b"\x80\x04K\x01.")  # a pickle is never unpickled
    with pytest.raises(DataError, match="not a valid safetensors"):
        load_checkpoint(tmp_path / "evil.pt")
    with pytest.raises(DataError, match="not found"):
        load_checkpoint(tmp_path / "missing.safetensors")
