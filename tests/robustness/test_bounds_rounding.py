"""Issue 38 item 7: IBP/CROWN certificates keep a sound margin for the model's own float32 rounding.

The bounds hold for exact arithmetic; the model computes in float32. Before the fix a margin bound of 0.5 certified
the point below although the model's own float32 forward pass classifies it wrongly (fl(1e8 + 1) = 1e8 erases the
margin); a margin of ≈ 3e-6 was what the review saw on real nets.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from modelward.robustness.bounds import certify_bounds, rounding_bound, rounding_layers


def test_a_margin_float32_erases_is_not_certified() -> None:
    net = nn.Sequential(nn.Linear(1, 2), nn.ReLU(), nn.Linear(2, 2)).eval()
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor([[1e8], [1e8]]))
        net[0].bias.copy_(torch.tensor([1.0, 0.0]))
        net[2].weight.copy_(torch.tensor([[1.0, -1.0], [0.0, 0.0]]))
        net[2].bias.copy_(torch.tensor([0.0, 0.5]))
    x, y = torch.ones(1, 1), torch.tensor([0])
    assert int(net(x).argmax(1)) == 1  # the model itself gets it wrong
    for method in ("ibp", "crown"):
        c = certify_bounds(net, x, y, 0.0, "linf", method, clip=(0.0, 2.0))
        assert float(c.margin_lower[0, 1]) == pytest.approx(0.5)  # exact arithmetic: +0.5
        assert not bool(c.certified[0]) and float(c.rounding[0, 1]) > 0.5


@pytest.mark.parametrize("norm,eps", [("linf", 0.05), ("l2", 0.3)])
def test_rounding_bound_covers_the_float32_error_anywhere_in_the_ball(norm: str, eps: float) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 36, 32),
                        nn.ReLU(), nn.Linear(32, 5)).eval()
    with torch.no_grad():
        net[1].running_mean.uniform_(-1, 1)
        net[1].running_var.uniform_(0.5, 2)
    x = torch.rand(1, 1, 8, 8)
    layers = rounding_layers(net, (1, 8, 8))
    bound = rounding_bound(layers, x.double().flatten(), eps, norm)
    net64 = copy.deepcopy(net).double()  # the exact arithmetic, to within float64's 1e-16
    worst = torch.zeros(5, dtype=torch.float64)
    for _ in range(200):
        d = torch.randn_like(x)
        d = d.sign() * eps if norm == "linf" else d / d.norm() * eps
        xp = (x + d).clamp(0, 1)
        with torch.no_grad():
            worst = torch.maximum(worst, (net(xp).double() - net64(xp.double())).abs()[0])
    assert bool((worst <= bound).all()), (worst, bound)
    assert float(bound.max()) < 1e-3  # and small: it only removes points certified by a hair
