"""Curve and cost semantics: L at cost 0, then at the first cost ≥ each multiple of eval_every, stop at ℓ, end."""

import numpy as np
import pytest

from modelward.completion.metric import Thresholds, hardness_ratio
from modelward.rl.evaluate import CurveRecorder, episode_returns, loss_from_returns, random_policy


def test_recorder_costs_and_stop():
    losses = iter([0.0, -1.0, -2.0, -5.0, -6.0])
    seen = []
    rec = CurveRecorder(lambda: next(losses), every=100, stop_at=-4.0, on_eval=lambda c, v: seen.append((c, v)))
    assert rec.start() is False
    assert rec.step(80) is False  # between evaluations: nothing recorded
    assert rec.step(160) is False and rec.step(180) is False
    assert rec.step(200) is False
    assert rec.step(320) is True  # -5 ≤ -4: stop
    curve = rec.finish(320)
    assert curve == [(0, 0.0), (160, -1.0), (200, -2.0), (320, -5.0)] == seen


def test_recorder_final_point_and_metric_on_rl_curve():
    vals = iter([-1.0, -3.0, -2.0, -4.0])
    rec = CurveRecorder(lambda: next(vals), every=50)
    rec.start()
    rec.step(64)
    rec.step(128)
    curve = rec.finish(130)
    assert curve == [(0, -1.0), (64, -3.0), (128, -2.0), (130, -4.0)]
    th = Thresholds.from_curve(curve, [1.0, 0.5])
    assert th.values[1.0] == -4.0 and th.costs[1.0] == 130 and th.costs[0.5] == 64
    assert hardness_ratio([(0, -1.0), (65, -4.0)], th.values[1.0], th.costs[1.0]).value == pytest.approx(0.5)


def test_episode_returns_are_reproducible_and_negated():
    r1 = episode_returns(random_policy(3, 0), "MinAtar/Breakout-v1", 4, seed=7, max_steps=50)
    r2 = episode_returns(random_policy(3, 0), "MinAtar/Breakout-v1", 4, seed=7, max_steps=50)
    assert r1 == r2 and len(r1) == 4
    assert loss_from_returns(r1) == pytest.approx(-np.mean(r1))
    capped = episode_returns(lambda o, live: np.zeros(len(o), int), "CartPole-v1", 2, seed=0, max_steps=5)
    assert all(r <= 5 for r in capped)
