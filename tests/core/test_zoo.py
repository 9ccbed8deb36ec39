"""Zoo sizing, App. B parameter counts, part resolution, resets and init schemes."""

from __future__ import annotations

import pytest
import torch

from modelward.core.config import allow_code
from modelward.core.parts import parts_table
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError


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


def test_entrypoint_model_and_bad_arch():
    m = build_model(allow_code(ModelConfig(arch="entrypoint", entrypoint="torch.nn:Linear",
                                           kwargs={"in_features": 4, "out_features": 2})), (4,), 2)
    assert isinstance(m, torch.nn.Linear)
    with pytest.raises(ConfigError, match="cannot import"):
        build_model(allow_code(ModelConfig(arch="entrypoint", entrypoint="no_such_pkg.x:f")), (4,), 2)
    with pytest.raises(ConfigError, match="needs image inputs"):
        build_model(ModelConfig(arch="cnn"), (30,), 2)


def test_arch_registry_matches_the_config_choices():
    from typing import get_args

    from modelward.core.zoo import ARCHITECTURES, Arch

    assert ARCHITECTURES.names() == sorted(get_args(Arch))
