"""GloRo layers: MinMax."""

from __future__ import annotations

import torch
from torch import nn

from modelward.robustness.gloro import (
    GloroNet,
    MinMax,
    build_gloro_model,
)

torch.set_num_threads(1)


def _blobs(n: int = 240, m: int = 4, d: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    centers = torch.rand(m, d, generator=g)
    y = torch.randint(m, (n,), generator=g)
    x = (centers[y] + 0.08 * torch.randn(n, d, generator=g)).clamp(0, 1)
    return x, y


def _mlp(d: int = 6, m: int = 4, seed: int = 0) -> nn.Sequential:
    return build_gloro_model("d(16).d(16)", (d,), m, seed=seed)


def _eps_for(model: nn.Module, x: torch.Tensor, q: float) -> float:
    """An ε at which about a fraction ``q`` of the points is certified: the q-quantile of the certified radii."""
    net = GloroNet(model, tuple(x.shape[1:]), 0.0)
    net.freeze()
    with torch.no_grad():
        f = model(x)
        j = f.argmax(1)
        r = (f.gather(1, j[:, None]) - f) / net.frozen_K[j].clamp_min(1e-12)
        r[torch.arange(len(x)), j] = float("inf")
        return float(r.min(1).values.quantile(1 - q))


# -- operator norms --------------------------------------------------------------------------------------------
def _conv_net(seed: int = 0) -> nn.Sequential:
    return build_gloro_model("c(8,3,1).c(8,4,2).d(16)", (1, 8, 8), 4, seed=seed)


def _images(n: int = 200, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, 8, 8, generator=g)
    return x, torch.randint(4, (n,), generator=g)


def test_minmax_is_a_gradient_norm_preserving_permutation() -> None:
    x = torch.randn(5, 8, 3, 3, requires_grad=True)
    out = MinMax()(x)
    assert torch.equal(out.sort(1).values, x.sort(1).values)
    gout = torch.randn_like(out)
    (gx,) = torch.autograd.grad(out, x, gout)
    assert torch.allclose(gx.flatten(1).norm(dim=1), gout.flatten(1).norm(dim=1))


