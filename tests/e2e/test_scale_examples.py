"""The ImageNet worked examples of docs/scale.md validate, and their parts exist in the architectures they name."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelward.completion.study import load_study
from modelward.core.parts import resolve_part
from modelward.core.zoo import build_model

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("name", ["completion_imagenet_alexnet.toml", "completion_imagenet_resnet50.toml"])
def test_imagenet_example_is_a_valid_gpu_study(name: str) -> None:
    cfg = load_study(EXAMPLES / name)
    assert cfg.data.source == "imagenet" and cfg.data.lazy and cfg.device == "cuda" and cfg.checkpoint_every
    model = build_model(cfg.model, (3, cfg.data.crop_size, cfg.data.crop_size), 1000)
    for part in cfg.parts:
        resolve_part(model, part)
