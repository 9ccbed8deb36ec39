"""Zoo sizing, App. B parameter counts, part resolution, resets and init schemes."""

from __future__ import annotations

import pytest
import torch

from modelward.core.parts import default_part_names, reset_part_, resolve_part
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import PartError


def test_part_names_globs_unions_and_errors():
    m = build_model(ModelConfig(arch="cnn"), (1, 8, 8), 10)
    assert default_part_names(m) == ["conv1", "conv2", "fc1", "logits"]
    assert set(resolve_part(m, "conv*").params) == set(resolve_part(m, "conv1+conv2").params)
    assert resolve_part(m, "fc1").params == ("fc1.weight", "fc1.bias")
    with pytest.raises(PartError, match="unknown part 'conv9'; valid parts: conv1, conv2, fc1, logits"):
        resolve_part(m, "conv9")
    with pytest.raises(PartError, match="'-W' needs a residual block"):
        resolve_part(m, "conv1-W")


def test_reset_changes_only_that_part():
    torch.manual_seed(0)
    m = build_model(ModelConfig(arch="resnet", sections=[1, 1], base_channels=4), (3, 8, 8), 5)
    m.train()
    m(torch.rand(8, 3, 8, 8))  # move BN running stats away from their initial values
    before = {k: v.clone() for k, v in m.state_dict().items()}
    part = reset_part_(m, "layer2.0-W", "glorot_uniform", torch.Generator().manual_seed(1))
    after = m.state_dict()
    inside = set(part.params) | set(part.buffers)
    assert not any(k.startswith("layer2.0.shortcut") for k in inside)
    for k in before:
        if k in inside and k.endswith("conv1.weight"):
            assert not torch.equal(before[k], after[k]), k
        if k not in inside:
            assert torch.equal(before[k], after[k]), k
