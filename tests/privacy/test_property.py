"""Property-inference pieces (§8.5) and the overt-encoding analysis (§8.6) with known answers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from modelward.errors import ConfigError
from modelward.privacy.property import column_matches, decode, f1_scores, ssim, stamp, watermark_universe


def test_watermarks_are_distinct_and_stamped_on_exactly_80_percent() -> None:
    marks = watermark_universe(30, (1, 8, 8), glyph=3, seed=0)
    flat = torch.nan_to_num(marks, nan=-1).flatten(1)
    assert len({tuple(r.tolist()) for r in flat}) == 30
    x = torch.rand(50, 1, 8, 8)
    xs, chosen = stamp(x, marks[4], 0.8, seed=1)
    assert int(chosen.sum()) == 40
    glyph = torch.nan_to_num(marks[4], nan=-1) == 1
    assert (xs[chosen][:, glyph] == 1).all() and torch.equal(xs[~chosen], x[~chosen])
    untouched = torch.isnan(marks[4])
    assert torch.equal(xs[:, untouched], x[:, untouched])
    with pytest.raises(ConfigError, match="image data"):
        watermark_universe(3, (64,))


def test_ssim_identity_and_order() -> None:
    g = torch.Generator().manual_seed(0)
    a = torch.rand(3, 1, 8, 8, generator=g)
    assert torch.allclose(ssim(a, a), torch.ones(3, dtype=torch.float64))
    noisy = (a + 0.3 * torch.rand(3, 1, 8, 8, generator=g)).clamp(0, 1)
    other = torch.rand(3, 1, 8, 8, generator=g)
    assert (ssim(a, noisy) > ssim(a, other)).all()
    assert torch.allclose(ssim(a, other), ssim(other, a))


def test_column_matches_find_planted_training_images() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.rand(20, 1, 6, 6, generator=g)
    lin = nn.Linear(36, 3)
    with torch.no_grad():  # unit 0 = image 7, unit 2 = −2·image 12 (Eq. 8.14: w = −2c)
        lin.weight.copy_(torch.randn(3, 36, generator=g))
        lin.weight[0] = x[7].flatten()
        lin.weight[2] = -2 * x[12].flatten()
    model = nn.Sequential(nn.Flatten(), lin, nn.ReLU(), nn.Linear(3, 2))
    top = column_matches(model, x, top=2)
    assert {(m.unit, m.train_index, m.sign) for m in top} == {(0, 7, 1), (2, 12, -1)}
    assert all(m.ssim == pytest.approx(1.0) for m in top)


def test_f1_scores() -> None:
    true = np.array([[1, 0], [0, 1], [1, 0]], bool)
    pred = np.array([[1, 0], [1, 1], [0, 0]], bool)
    f = f1_scores(pred, true)
    assert f["f1_micro"] == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))


def test_decode_predicts_at_least_the_most_likely_property() -> None:
    logits = torch.tensor([[-3.0, -1.0, -2.0], [2.0, -1.0, 0.5]])
    assert decode(logits).tolist() == [[False, True, False], [True, False, True]]
