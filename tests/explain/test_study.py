"""Loading the models `modelward explain` explains: `modelward train` and `modelward robust train` checkpoints."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from modelward.errors import ConfigError, DataError
from modelward.explain.study import ExplainConfig, default_layer, load_checkpoint


def test_robust_checkpoint_gives_the_logit_model(tmp_path: Path) -> None:
    from modelward.robustness.experiment import RobustConfig, build_net, save_model
    from modelward.robustness.gloro.layers import build_gloro_model

    cfg = RobustConfig()
    model = build_gloro_model(cfg.model.arch, (1, 8, 8), 10, cfg.model.activation, cfg.model.init, 0)
    net = build_net(model, (1, 8, 8), cfg.train, cfg.train.epsilon, 0)
    save_model(tmp_path / "model.safetensors", SimpleNamespace(model=model, net=net), cfg, (1, 8, 8), 10)  # type: ignore[arg-type]
    loaded, meta = load_checkpoint(tmp_path)
    x = torch.rand(3, 1, 8, 8)
    assert torch.allclose(loaded(x), model.eval()(x))
    assert meta["num_classes"] == 10
    layer = default_layer(loaded, x)
    assert isinstance(dict(loaded.named_modules())[layer], torch.nn.Linear)


def test_zoo_checkpoint_and_errors(tmp_path: Path) -> None:
    from modelward.core.io import save_state_dict, save_tensors
    from modelward.core.zoo import ModelConfig, build_model

    mcfg = ModelConfig(arch="mlp", hidden=[8])
    model = build_model(mcfg, (1, 8, 8), 10)
    save_state_dict(tmp_path / "m.safetensors", model.state_dict(),
                    {"model": mcfg.model_dump(mode="json"), "input_shape": [1, 8, 8], "num_classes": 10})
    loaded, _ = load_checkpoint(tmp_path / "m.safetensors")
    x = torch.rand(2, 1, 8, 8)
    assert torch.allclose(loaded(x), model(x))
    assert default_layer(loaded, x) == "fc1"
    save_tensors(tmp_path / "bare.safetensors", {"w": torch.zeros(2)})
    with pytest.raises(DataError, match="no architecture"):
        load_checkpoint(tmp_path / "bare.safetensors")
    with pytest.raises(ValueError, match="exactly one"):
        ExplainConfig.model_validate({"models": [{"name": "a"}]})
    assert ConfigError
