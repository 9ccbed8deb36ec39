import random
import sys

import numpy as np
import pytest
import torch

from modelward.core.device import resolve_device
from modelward.core.registry import Registry, lazy_exports
from modelward.core.seed import make_generator, seeded
from modelward.errors import ConfigError, DataError


def test_registry_names_errors_and_params() -> None:
    reg = Registry("widget")

    @reg.register("square")
    def square(x: float = 2.0, *, power: int = 2) -> float:
        return x**power

    reg.add("counter", "collections:Counter")
    assert reg.names() == ["counter", "square"] and "square" in reg
    assert reg.create("square", x=3.0) == 9.0
    assert reg.parameters("square") == ["x", "power"]
    with pytest.raises(ConfigError, match=r"unknown widget 'cube'; valid choices: \['counter', 'square'\]"):
        reg.get("cube")
    with pytest.raises(ConfigError, match=r"unknown parameter\(s\) \['y'\]; valid: \['x', 'power'\]"):
        reg.create("square", y=1)
    assert reg.create("counter", a=2)["a"] == 2  # **kwargs entries accept anything; lazy import resolved
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("square")(lambda: 0)
    with pytest.raises(ValueError, match="package.module:Attr"):
        reg.add("bad", "no_colon")


def test_config_and_data_errors_are_value_errors() -> None:
    assert issubclass(ConfigError, ValueError) and issubclass(DataError, ValueError)


def test_lazy_exports_import_on_first_access() -> None:
    mod = type(sys)("fake_pkg_for_lazy")
    sys.modules[mod.__name__] = mod
    try:
        mod.__getattr__, mod.__dir__ = lazy_exports(mod.__name__, {"OrderedDict": "collections:OrderedDict"})
        assert "OrderedDict" in mod.__dir__()
        from collections import OrderedDict

        assert mod.OrderedDict is OrderedDict
        with pytest.raises(AttributeError, match="no attribute 'Nope'"):
            mod.Nope  # noqa: B018
    finally:
        del sys.modules[mod.__name__]


def test_seeded_is_reproducible_and_restores_outer_state() -> None:
    torch.manual_seed(123)
    np.random.seed(5)
    random.seed(5)
    expected = (torch.rand(3), np.random.rand(), random.random())
    torch.manual_seed(123)
    np.random.seed(5)
    random.seed(5)
    with seeded(7):
        a = (torch.rand(3), np.random.rand(), random.random())
    after = (torch.rand(3), np.random.rand(), random.random())
    assert torch.equal(after[0], expected[0]) and after[1:] == expected[1:]  # outer streams untouched
    with seeded(7):
        b = (torch.rand(3), np.random.rand(), random.random())
    assert torch.equal(a[0], b[0]) and a[1:] == b[1:]
    with pytest.raises(RuntimeError), seeded(1):
        raise RuntimeError
    assert torch.equal(make_generator(3).initial_seed() * torch.ones(1), torch.tensor([3.0]))
    assert torch.equal(torch.rand(2, generator=make_generator(3)), torch.rand(2, generator=make_generator(3)))


def test_resolve_device() -> None:
    assert resolve_device() == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    auto = resolve_device("auto")
    assert auto.type == ("cuda" if torch.cuda.is_available() else auto.type)
    with pytest.raises(ConfigError, match="valid choices"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA GPU"):
            resolve_device("cuda:0")
    else:
        with pytest.raises(ConfigError, match="CUDA device"):
            resolve_device(f"cuda:{torch.cuda.device_count()}")
