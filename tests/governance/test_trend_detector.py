"""The trend detector (issue 36 item 2): a CUSUM of the rows' losses that stays quiet over long honest-looking
streams, alarms within a few steps of a sustained rise, names the last step in control and does not absorb a rise
into its reference."""

import math

import pytest
import torch

from modelward.governance.trend_detector import TrendConfig, TrendDetector

K = 10
GOOD, BAD = 1e-3, 9.0  # a fitted row's loss, a row carrying another image's activation (nats)


def batch(gen: torch.Generator, bad_rate: float, rows: int = 64) -> torch.Tensor:
    """A batch's per-row losses: Poisson(bad_rate) badly fitted rows, the rest fitted."""
    n = min(rows, int(torch.poisson(torch.tensor([bad_rate]), generator=gen)))
    return torch.cat([torch.full((rows - n,), GOOD), torch.full((n,), BAD)])


def test_no_alarm_over_a_long_stream_of_honest_looking_batches():
    """20,000 steps whose rate of badly fitted rows falls from 20 per batch to 0.1 and then stays Poisson: the
    regime of honest training (bench/split_false_refusals.py measures the real thing)."""
    gen = torch.Generator().manual_seed(0)
    det = TrendDetector(TrendConfig(), K)
    for s in range(20_000):
        rate = max(0.1, 20.0 * math.exp(-s / 30))
        assert det.observe(s, batch(gen, rate)) is None, (s, det.state())
    assert det.max_S < det.cfg.threshold


def test_a_sustained_rise_alarms_within_a_few_steps_and_names_the_step_before_it():
    gen = torch.Generator().manual_seed(1)
    det = TrendDetector(TrendConfig(), K)
    for s in range(300):
        assert det.observe(s, batch(gen, 0.05)) is None
    alarm = None
    for s in range(300, 320):  # two badly fitted rows more per batch
        alarm = det.observe(s, torch.cat([batch(gen, 0.05, 62), torch.full((2,), BAD)]))
        if alarm is not None:
            break
    assert alarm is not None and alarm.step <= 303, alarm
    assert 290 <= alarm.good_step <= 300 and alarm.statistic > det.cfg.threshold  # in control up to the rise
    assert f"in control up to step {alarm.good_step}" in alarm.describe()


def test_the_reference_does_not_absorb_a_rise_being_accumulated():
    """A slow ramp (0.05 more badly fitted rows per step) is caught: the reference only follows steps in control."""
    gen = torch.Generator().manual_seed(2)
    det = TrendDetector(TrendConfig(), K)
    for s in range(200):
        det.observe(s, batch(gen, 0.05))
    ref = det.rate
    alarm = None
    for i in range(200):
        alarm = det.observe(200 + i, batch(gen, 0.05 + 0.05 * i))
        if alarm is not None:
            break
    assert alarm is not None and i < 60, i
    assert det.rate < ref + 0.5


def test_warm_up_off_and_non_finite_losses():
    det = TrendDetector(TrendConfig(), K, warmup_steps=5)
    worst = torch.full((64,), BAD)
    assert all(det.observe(s, worst if s else torch.full((64,), GOOD)) is None for s in range(5))  # warm-up
    off = TrendDetector(TrendConfig(enabled=False), K)
    assert all(off.observe(s, worst) is None for s in range(50))
    assert det.count(torch.tensor([float("nan"), float("inf"), 0.0])) == pytest.approx(2.0)  # badly fitted
    again = TrendDetector(TrendConfig(), K)
    again.load_state(det.state())
    assert again.state() == det.state()
