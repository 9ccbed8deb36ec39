"""GloRo layers: MinMax."""

from __future__ import annotations

import torch

from modelward.robustness.gloro import (
    MinMax,
)

torch.set_num_threads(1)


def test_minmax_is_a_gradient_norm_preserving_permutation() -> None:
    x = torch.randn(5, 8, 3, 3, requires_grad=True)
    out = MinMax()(x)
    assert torch.equal(out.sort(1).values, x.sort(1).values)
    gout = torch.randn_like(out)
    (gx,) = torch.autograd.grad(out, x, gout)
    assert torch.allclose(gx.flatten(1).norm(dim=1), gout.flatten(1).norm(dim=1))


