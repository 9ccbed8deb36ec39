"""L-BFGS finds the minimum-norm direction of a linear model."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from modelward.robustness.attacks import make_attack
from modelward.robustness.attacks.base import predict

torch.set_num_threads(1)  # the CI box is shared; oversubscribed BLAS threads are 10-50x slower


def test_lbfgs_finds_minimum_norm_direction_on_linear_model():
    torch.manual_seed(0)
    lin = nn.Linear(10, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(2, 10))
        lin.bias.zero_()
    x = torch.rand(8, 10) * 0.2 + 0.4
    y = predict(lin, x)
    w = (lin.weight[1] - lin.weight[0]).detach()  # logit margin of class 1 over class 0 is w·x + b
    with torch.no_grad():
        margin = x @ w + (lin.bias[1] - lin.bias[0])
    r_star = -margin[:, None] * w[None] / w.dot(w)  # analytic minimum-norm perturbation to the boundary
    res = make_attack("lbfgs", lin, clip=(-10.0, 10.0), binary_steps=12, max_iter=100)(x, y)
    r = res.x_adv - x
    assert bool(res.success.all())
    cos = F.cosine_similarity(r, r_star, dim=1)
    assert float(cos.min()) > 0.999
    ratio = r.norm(dim=1) / r_star.norm(dim=1)
    assert float(ratio.min()) >= 1.0 - 1e-4 and float(ratio.max()) < 1.1


