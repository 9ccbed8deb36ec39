"""Bounded influence (issue 36 item 2): per-row clipping, the step cap and bounded running statistics bound what one
step can change whatever the rows, drift at the documented rate at most, and leave an unclipped step bit for bit
as it was."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from modelward.governance.bounded_influence import BoundedInfluence, InfluenceConfig


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4))


def test_an_unclipped_batch_is_the_plain_cross_entropy_bit_for_bit():
    seg = mlp()
    bi = BoundedInfluence(InfluenceConfig(row_multiple=1e9), seg, label_holder=True, receives=True)
    x, y = torch.randn(32, 6), torch.randint(0, 4, (32,))
    root, per_row = bi.loss(seg(x), y)
    assert bi.clipped_rows == 0 and torch.equal(root, F.cross_entropy(seg(x), y))
    assert torch.equal(per_row, F.cross_entropy(seg(x), y, reduction="none"))


def test_no_row_pulls_the_last_layer_harder_than_the_clip():
    """Rows of the sender's choice (activations 300x the others) are cut to row_multiple x C: the exact per-row
    gradient norm on the last layer, w_i * r_i, is at most the limit, and the step's gradient is bounded by it."""
    seg = mlp()
    bi = BoundedInfluence(InfluenceConfig(), seg, label_holder=True, receives=True)
    x, y = torch.randn(64, 6), torch.randint(0, 4, (64,))
    bi.loss(seg(x), y)  # the clip starts at the median of an honest batch
    x[:4] *= 300.0
    out = seg(x)
    r = bi.row_norms(out, y)
    limit = bi.cfg.row_multiple * bi.clip
    root, _ = bi.loss(out, y)
    assert bi.clipped_rows == int((r > limit).sum()) >= 1 and bool((r[:4] > limit).any())
    seg.zero_grad()
    root.backward()
    last = seg[2]
    g = torch.cat([last.weight.grad.flatten(), last.bias.grad])
    w = torch.clamp(limit / r, max=1.0)
    assert torch.all(w * r <= limit * (1 + 1e-5))  # float32 rounding of the norms
    assert float(g.norm()) <= limit * (1 + 1e-5)  # (1/B) Σ w_i g_i: at most the largest row's norm


def test_the_clip_drifts_at_most_exp_rate_times_quantile_per_step():
    seg = mlp()
    cfg = InfluenceConfig()
    bi = BoundedInfluence(cfg, seg, label_holder=True, receives=True)
    y = torch.randint(0, 4, (64,))
    bi.loss(seg(torch.randn(64, 6)), y)
    c0 = bi.clip
    for _ in range(20):  # every row far above the clip, step after step
        bi.loss(seg(1e3 * torch.randn(64, 6)), y)
    assert bi.clip <= c0 * math.exp(cfg.row_rate * cfg.row_quantile) ** 20 * (1 + 1e-9)


def test_the_step_cap_scales_an_outsized_gradient_and_its_average_grows_boundedly():
    cfg = InfluenceConfig()
    bi = BoundedInfluence(cfg, nn.Linear(3, 3), label_holder=False, receives=False, warmup_steps=5)
    p = nn.Parameter(torch.zeros(100))
    for _ in range(5):  # warm-up: recorded, never scaled
        p.grad = torch.ones(100)
        assert bi.cap_step([p]) == 1.0
    avg = math.exp(bi.step_norm_log)
    p.grad = torch.full((100,), 1e3)
    factor = bi.cap_step([p])
    assert factor < 1.0 and float(p.grad.norm()) == pytest.approx(cfg.step_multiple * avg, rel=1e-5)
    assert bi.counts["steps_capped"] == 1
    before = bi.step_norm_log
    for _ in range(30):  # a gradient as large as it likes, every step: the cap rises by a bounded factor
        p.grad = torch.full((100,), 1e9)
        bi.cap_step([p])
    assert bi.step_norm_log - before <= 31 * (1 - cfg.step_decay) * math.log(cfg.step_multiple) + 1e-9


def test_running_statistics_move_boundedly_and_an_ordinary_step_is_untouched():
    seg = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    bi = BoundedInfluence(InfluenceConfig(), seg, label_holder=False, receives=True)
    seg.train()
    seg(torch.randn(16, 3, 6, 6))
    before = {k: v.clone() for k, v in seg.state_dict().items()}
    seg(torch.randn(16, 3, 6, 6))  # an ordinary batch
    after = {k: v.clone() for k, v in seg.state_dict().items()}
    assert bi.bound_buffers(before, dict(seg.state_dict())) == 0
    assert all(torch.equal(after[k], v) for k, v in seg.state_dict().items())
    before = after
    seg(300 * torch.randn(16, 3, 6, 6))  # h = 300·N(0,1): the running variance would jump ~1e4-fold
    live = dict(seg.state_dict())
    assert bi.bound_buffers(before, live) == 2
    c = bi.cfg.buffer_change
    assert torch.all(live["1.running_var"] <= before["1.running_var"] * (1 + c) * (1 + 1e-6))
    assert torch.all((live["1.running_mean"] - before["1.running_mean"]).abs()
                     <= c * before["1.running_var"].sqrt() * (1 + 1e-6))


def test_off_means_off_and_the_state_round_trips():
    seg = mlp()
    off = BoundedInfluence(InfluenceConfig(enabled=False), seg, label_holder=True, receives=True)
    x, y = 300 * torch.randn(64, 6), torch.randint(0, 4, (64,))
    root, _ = off.loss(seg(x), y)
    assert off.clipped_rows == 0 and torch.equal(root, F.cross_entropy(seg(x), y))
    on = BoundedInfluence(InfluenceConfig(), seg, label_holder=True, receives=True)
    on.loss(seg(torch.randn(64, 6)), y)
    again = BoundedInfluence(InfluenceConfig(), seg, label_holder=True, receives=True)
    again.load_state(on.state())
    assert again.state() == on.state()


def test_the_part_keeps_nothing_of_a_step_and_stays_copyable():
    """The features the per-row norms need are read once per training forward: no graph tensor stays on the part
    (a copy.deepcopy of it works after a step) and an evaluation pass keeps nothing."""
    seg = mlp()
    bi = BoundedInfluence(InfluenceConfig(), seg, label_holder=True, receives=True)
    root, _ = bi.loss(seg(torch.randn(64, 6)), torch.randint(0, 4, (64,)))
    root.backward()
    assert bi._features is None
    seg.train()
    seg(torch.randn(8, 6, requires_grad=True))  # a forward whose loss never comes (an aborted step)
    assert bi._features is not None and bi._features.grad_fn is None
    copy.deepcopy(seg)
    seg.eval()
    seg(torch.randn(500, 6))
    assert bi._features is None
