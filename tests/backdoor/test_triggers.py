"""Triggers: where a patch goes, what blending and warping do, and that every trigger stays in the box."""

from __future__ import annotations

import pytest
import torch

from modelward.backdoor.triggers import BlendTrigger, MaskTrigger, PatchTrigger, WarpTrigger
from modelward.errors import ConfigError


@pytest.mark.parametrize("loc,rows,cols", [("bottom_right", slice(5, 8), slice(5, 8)), ("top_left", slice(0, 3),
                                                                                        slice(0, 3)),
                                           ("center", slice(2, 5), slice(2, 5))])
def test_patch_touches_only_its_square(loc: str, rows: slice, cols: slice) -> None:
    x = torch.full((2, 3, 8, 8), 0.5)
    y = PatchTrigger(size=3, location=loc, pattern="checker").apply(x)
    changed = (y != x).any(0).any(0)
    inside = torch.zeros(8, 8, dtype=torch.bool)
    inside[rows, cols] = True
    assert not changed[~inside].any()
    assert set(y[:, :, rows, cols].unique().tolist()) == {0.0, 1.0}  # the checker's two values, every channel


def test_patch_amplitude_blends_and_random_pattern_is_seeded() -> None:
    x = torch.zeros(1, 1, 4, 4)
    half = PatchTrigger(size=2, pattern="white", amplitude=0.5).apply(x)
    assert half[0, 0, 2:, 2:].eq(0.5).all() and half[0, 0, :2].eq(0).all()
    a = PatchTrigger(size=2, pattern="random", seed=1).apply(x)
    b = PatchTrigger(size=2, pattern="random", seed=1).apply(x)
    c = PatchTrigger(size=2, pattern="random", seed=2).apply(x)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_blend_is_the_convex_mix() -> None:
    t = BlendTrigger(alpha=0.2, seed=3)
    x = torch.rand(4, 3, 6, 6)
    p = t.pattern_for(x.shape)
    torch.testing.assert_close(t.apply(x), 0.8 * x + 0.2 * p)


def test_warp_is_the_identity_at_zero_strength_and_moves_pixels_otherwise() -> None:
    x = torch.rand(3, 1, 16, 16)
    torch.testing.assert_close(WarpTrigger(strength=0.0).apply(x), x, atol=1e-5, rtol=0)
    w = WarpTrigger(strength=2.0, seed=0)
    y = w.apply(x)
    assert (y - x).abs().mean() > 0.01
    assert torch.equal(y, WarpTrigger(strength=2.0, seed=0).apply(x))  # the field is fixed by the seed
    assert not torch.equal(y, WarpTrigger(strength=2.0, seed=1).apply(x))
    noisy = w.warp(x, w.noisy(3, 16, 16, torch.Generator().manual_seed(0)))
    assert not torch.equal(noisy, y)  # noise mode is another warp


@pytest.mark.parametrize("trigger", [PatchTrigger(pattern="white", clip=(0.0, 0.5)), BlendTrigger(alpha=0.9,
                                                                                                 clip=(0.0, 0.5)),
                                     WarpTrigger(strength=3.0, clip=(0.0, 0.5))])
def test_triggers_stay_in_the_box(trigger: object) -> None:
    y = trigger.apply(torch.rand(5, 3, 8, 8) * 0.5)  # type: ignore[attr-defined]
    assert y.min() >= 0.0 and y.max() <= 0.5


def test_mask_trigger_and_non_images() -> None:
    m = torch.zeros(1, 4, 4)
    m[0, 0, 0] = 1.0
    t = MaskTrigger(m, torch.ones(1, 4, 4))
    y = t.apply(torch.zeros(2, 1, 4, 4))
    assert y.sum() == 2.0 and y[:, 0, 0, 0].eq(1).all()
    with pytest.raises(ConfigError, match="N×C×H×W"):
        PatchTrigger().apply(torch.zeros(4, 64))
