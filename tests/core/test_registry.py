import sys

import pytest

from modelward.core.registry import Registry, lazy_exports
from modelward.errors import ConfigError


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
    with pytest.raises(ConfigError, match=r"unknown parameter\(s\) \['x'\]; valid: \['power'\]"):
        reg.create("square", 3.0, x=1)  # a positional argument is no longer a keyword choice
    assert reg.create("square", 3.0, power=3) == 27.0
    assert reg.create("counter", a=2)["a"] == 2  # **kwargs entries accept anything; lazy import resolved
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("square")(lambda: 0)
    with pytest.raises(ValueError, match="package.module:Attr"):
        reg.add("bad", "no_colon")


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
