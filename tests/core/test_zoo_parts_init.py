"""Zoo sizing, App. B parameter counts, part resolution, resets and init schemes."""

from __future__ import annotations

import math

import pytest
import torch

from modelward.core.init import init_weight_
from modelward.core.parts import default_part_names, parts_table, reset_part_, resolve_part
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError, PartError


@pytest.mark.parametrize("arch,shape", [("mlp", (1, 8, 8)), ("cnn", (1, 8, 8)), ("alexnet", (1, 8, 8)),
                                        ("resnet", (3, 16, 16)), ("alexnet", (3, 64, 64))])
def test_models_fit_their_inputs(arch, shape):
    m = build_model(ModelConfig(arch=arch, width=0.125, base_channels=8), shape, 7)
    assert m(torch.rand(2, *shape)).shape == (2, 7)


def test_paper_parameter_counts_app_b():
    alex = build_model(ModelConfig(arch="alexnet"), (3, 224, 224), 1000)
    rows = {r["part"]: r["params_excl_norm"] for r in parts_table(alex)}
    # Table 3 with its Conv 2 typo corrected (614,654 -> 614,656)
    assert [rows[k] for k in ("conv1", "conv2", "conv3", "conv4", "conv5", "linear1", "linear2", "logits")] == [
        34_944, 614_656, 885_120, 1_327_488, 884_992, 1_052_672, 16_781_312, 4_096_000]
    res = build_model(ModelConfig(arch="resnet", sections=[3, 4, 6, 3]), (3, 224, 224), 1000)
    counts = {r["part"]: r["params"] for r in parts_table(res)}
    assert counts == {"conv1": 9_536, "layer1.0": 75_008, "layer2.0": 379_392, "layer3.0": 1_512_448,
                      "layer4.0": 6_039_552, "layer4.0-W": 3_938_304, "fc": 2_048_000, "total": counts["total"]}


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


@pytest.mark.parametrize("scheme,expected_std", [
    ("glorot_uniform", math.sqrt(2 / (200 + 300))), ("glorot_normal", math.sqrt(2 / (200 + 300))),
    ("msra", math.sqrt(2 / 300)), ("caffe", math.sqrt(1 / 300))])
def test_init_scheme_variances(scheme, expected_std):
    w = torch.empty(200, 300)
    init_weight_(w, scheme, torch.Generator().manual_seed(0))
    assert abs(w.std().item() - expected_std) / expected_std < 0.03


def test_entrypoint_model_and_bad_arch():
    m = build_model(ModelConfig(arch="entrypoint", entrypoint="torch.nn:Linear",
                                kwargs={"in_features": 4, "out_features": 2}), (4,), 2)
    assert isinstance(m, torch.nn.Linear)
    with pytest.raises(ConfigError, match="cannot import"):
        build_model(ModelConfig(arch="entrypoint", entrypoint="no_such_pkg.x:f"), (4,), 2)
    with pytest.raises(ConfigError, match="needs image inputs"):
        build_model(ModelConfig(arch="cnn"), (30,), 2)


def test_arch_registry_matches_the_config_choices():
    from typing import get_args

    from modelward.core.zoo import ARCHITECTURES, Arch

    assert ARCHITECTURES.names() == sorted(get_args(Arch))
