"""torchvision and timm models as model sources (core/sources.py). These need the vision extra, which lives in its
own venv (`make vision` makes .venv-vision; `make test-vision` runs these tests there): elsewhere they skip."""

from __future__ import annotations

import pytest
import torch

from modelward.core import sources
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError

try:
    tv = sources.import_torchvision()
    timm = sources.import_timm()
except ConfigError as e:
    pytest.skip(f"the vision extra is not installed here ({e})", allow_module_level=True)


def test_torchvision_and_timm_classifiers_are_built_without_weights():
    for source in ("torchvision", "timm"):
        net = build_model(ModelConfig(source=source, name="resnet18"), (3, 32, 32), 10).eval()
        assert net(torch.rand(2, 3, 32, 32)).shape == (2, 10)
        assert net.part_names[0] == "conv1" and net.part_names[-1] == "fc"
    grey = build_model(ModelConfig(source="timm", name="resnet18"), (1, 32, 32), 4).eval()  # in_chans: the data
    assert grey(torch.rand(1, 1, 32, 32)).shape == (1, 4)


def test_downloads_and_unknown_names_are_refused():
    with pytest.raises(ConfigError, match="never downloads"):
        build_model(ModelConfig(source="torchvision", name="resnet18", kwargs={"weights": "DEFAULT"}), (3, 32, 32), 10)
    with pytest.raises(ConfigError, match="never downloads"):
        build_model(ModelConfig(source="timm", name="resnet18", kwargs={"pretrained": True}), (3, 32, 32), 10)
    with pytest.raises(ConfigError, match="not a torchvision classification model"):
        build_model(ModelConfig(source="torchvision", name="resnet81"), (3, 32, 32), 10)
    with pytest.raises(ConfigError, match="3-channel"):
        build_model(ModelConfig(source="torchvision", name="resnet18"), (1, 32, 32), 10)


def test_the_operator_schemas_are_defined_only_when_torchvision_needs_them():
    ops_loaded = tv.extension._has_ops()
    # the shim runs exactly when torchvision's C++ library cannot load (PyPI's CUDA-linked wheel beside a CPU torch)
    assert (sources._TORCHVISION_LIB is None) == ops_loaded
    if not ops_loaded:  # detection operators then fail with torchvision's own message, not a crash
        with pytest.raises(RuntimeError, match="Couldn't load custom C\\+\\+ ops"):
            tv.ops.nms(torch.rand(3, 4), torch.rand(3), 0.5)
    assert sources.import_torchvision() is tv  # idempotent
