"""core.slicing: capture h(x) and stop the forward pass there, replace z to run g, refuse ambiguous cuts."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from modelward.core.slicing import Cut, capture, intercept, replace
from modelward.errors import ConfigError


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 2)).eval()


def test_capture_then_replace_is_the_whole_model_at_both_anchors() -> None:
    net, x = _mlp(), torch.randn(6, 3)
    for cut in (Cut("2", "in"), Cut("2", "out"), Cut("4", "in")):
        z = capture(net, cut, x)
        y = replace(net, cut, z, torch.zeros_like(x))  # the dummy input matters only below the cut
        assert torch.allclose(y, net(x), atol=1e-6), cut
    assert torch.equal(capture(net, Cut("2", "in"), x), net[1](net[0](x)))  # the same ops and shapes: exact


def test_capture_stops_the_forward_pass_at_the_cut() -> None:
    net, ran = _mlp(), []
    net[4].register_forward_hook(lambda *_: ran.append(1))
    capture(net, Cut("2"), torch.randn(2, 3))
    assert ran == []  # nothing above the cut ran
    net(torch.randn(2, 3))
    assert ran == [1]


class _Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.block(x))


def test_a_module_called_twice_or_never_is_refused_and_hooks_are_removed() -> None:
    net = _Twice()
    with pytest.raises(ConfigError, match="more than once"):
        replace(net, Cut("block"), torch.zeros(1, 3), torch.zeros(1, 3))
    assert not net.block._forward_hooks  # the hook is gone even after the error
    unused = nn.ModuleDict({"a": nn.Linear(2, 2), "b": nn.Linear(2, 2)})
    with pytest.raises(ConfigError, match="not called"), intercept(unused, Cut("b")) as seen:
        unused["a"](torch.zeros(1, 2))
        seen.check_called(Cut("b"))
    with pytest.raises(ConfigError, match="valid layers: 0, 1, 2, 3, 4"):
        capture(_mlp(), Cut("fc9"), torch.zeros(1, 3))
    with pytest.raises(ConfigError, match="valid choices"):
        capture(_mlp(), Cut("0", "side"), torch.zeros(1, 3))  # type: ignore[arg-type]
