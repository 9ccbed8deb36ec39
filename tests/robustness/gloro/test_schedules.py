"""GloRo ε / λ schedules."""

from __future__ import annotations

import pytest
import torch

from modelward.robustness.gloro import (
    Schedule,
    decay_to,
)

torch.set_num_threads(1)


def test_schedules() -> None:
    lin = Schedule(kind="linear", start=0.1, end=2.0, until=1.0)
    assert lin.at(0, 100) == pytest.approx(0.1) and lin.at(50, 100) == pytest.approx(1.05)
    assert lin.at(100, 100) == pytest.approx(2.0) and lin.at(150, 100) == pytest.approx(2.0)
    log = Schedule(kind="log", start=0.0, end=1.0)
    assert log.at(0, 10) == pytest.approx(0.0) and log.at(5, 10) == pytest.approx(1.0)
    assert log.at(2.5, 10) > 0.5  # concave: faster than linear early on
    assert Schedule(kind="single", end=0.3).at(0, 10) == 0.3
    assert decay_to(1e-3, 1e-6, 40, 100) == 1e-3
    assert decay_to(1e-3, 1e-6, 100, 100) == pytest.approx(1e-6)
    assert decay_to(1e-3, 1e-6, 75, 100) == pytest.approx((1e-3 * 1e-6) ** 0.5)


