"""LiRA and RMIA against scores computed by hand from the same shadow models."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from modelward.privacy.membership import AttackData
from modelward.privacy.membership.lira import LiRA, logit_confidence
from modelward.privacy.membership.rmia import RMIA, true_prob
from modelward.privacy.shadows import ShadowPool


def _setup() -> tuple[AttackData, ShadowPool]:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(12, 3, generator=g), torch.randint(0, 3, (12,), generator=g)
    models = []
    for _ in range(6):
        m = nn.Linear(3, 3)
        with torch.no_grad():
            m.weight.copy_(torch.randn(3, 3, generator=g))
            m.bias.copy_(torch.randn(3, generator=g))
        models.append(m.eval())
    masks = np.zeros((6, 12), bool)
    masks[[0, 2, 4], :6] = True
    masks[[1, 3, 5], 6:] = True
    pool = ShadowPool(models, x, y, masks)
    target = nn.Linear(3, 3).eval()
    return AttackData(target, x[6:], y[6:], 3, shadows=pool), pool


def test_logit_confidence_is_log_odds_of_the_true_class() -> None:
    logits = torch.tensor([[2.0, 0.5, -1.0], [0.0, 0.0, 3.0]])
    y = torch.tensor([0, 1])
    p = torch.softmax(logits, 1)[torch.arange(2), y].double()
    assert np.allclose(logit_confidence(logits, y), (torch.log(p) - torch.log1p(-p)).numpy())


def test_lira_online_and_offline_match_hand_computed_gaussians() -> None:
    data, pool = _setup()
    x, y = pool.x_pool, pool.y_pool
    # (K, n): the shadows' confidences on the whole pool in one 12-row pass, as fit() computes them
    phi = np.stack([logit_confidence(m(x).detach(), y) for m in pool.models])
    on = LiRA(online=True, global_variance=False).fit(data)
    off = LiRA(online=False, global_variance=False).fit(data)
    i = 2  # in for models 0, 2, 4
    # the target's confidence on the row alone, as score() computes it: the same float32 forward pass, so the
    # float64 formulas below agree to rel 1e-9. (From the 12-row batch instead, the GEMM may round the float32
    # logits differently on another CPU or kernel path: -0.31006833 vs -0.31006840, rel 2e-7, on an AMX machine)
    obs_i = logit_confidence(data.target(x[i:i + 1]).detach(), y[i:i + 1])[0]
    mi, mo = phi[[0, 2, 4], i], phi[[1, 3, 5], i]
    expect_on = stats.norm.logpdf(obs_i, mi.mean(), mi.std() + 1e-6) - stats.norm.logpdf(obs_i, mo.mean(),
                                                                                        mo.std() + 1e-6)
    assert on.score(x[i:i + 1], y[i:i + 1])[0] == pytest.approx(expect_on, rel=1e-9)
    assert off.score(x[i:i + 1], y[i:i + 1])[0] == pytest.approx(
        stats.norm.logcdf(obs_i, mo.mean(), mo.std() + 1e-6), rel=1e-9)
    # a point outside the pool: every shadow is "out"
    z = torch.zeros(1, 3)
    phis = np.array([logit_confidence(m(z).detach(), y[:1])[0] for m in pool.models])
    expect = stats.norm.logcdf(logit_confidence(data.target(z).detach(), y[:1])[0], phis.mean(), phis.std() + 1e-6)
    assert on.score(z, y[:1])[0] == pytest.approx(expect, rel=1e-9)


def test_rmia_offline_score_is_the_fraction_of_dominated_population_points() -> None:
    data, pool = _setup()
    a, gamma = 0.3, 1.0
    att = RMIA(online=False, a=a, gamma=gamma, population=6).fit(data)
    x, y = pool.x_pool[:3], pool.y_pool[:3]

    def pr_x(xx: torch.Tensor, yy: torch.Tensor, rows: list[int]) -> np.ndarray:
        probs = np.stack([true_prob(m, xx, yy) for m in pool.models])
        out = []
        for j, r in enumerate(rows):
            p_out = probs[~pool.masks[:, r], j].mean()
            out.append(0.5 * ((1 + a) * p_out + (1 - a)))
        return np.array(out)

    rx = true_prob(data.target, x, y) / pr_x(x, y, [0, 1, 2])
    xz, yz = pool.x_pool[6:], pool.y_pool[6:]  # the population = the whole hold-out (6 points)
    rz = true_prob(data.target, xz, yz) / pr_x(xz, yz, list(range(6, 12)))
    expect = (rx[:, None] / rz[None, :] > gamma).mean(1)
    assert np.allclose(att.score(x, y), expect)
