"""The tentative step on its own: a tiny segment with BatchNorm and a momentum optimizer, no party around it."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from modelward.core.train import TrainConfig, make_optimizer
from modelward.governance.party.step import TentativeStep
from modelward.governance.protocol import NumericError, StepRolledBack


def _step(limit: float = 1e6) -> TentativeStep:
    torch.manual_seed(0)
    seg = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    bound = {"limit": limit}
    t = TentativeStep("bob", seg, lambda: bound["limit"], update_priority="normal")
    t.bound, t.segment = bound, seg  # (for the tests)
    t.train_cfg = TrainConfig(optimizer="sgd", lr=0.1, momentum=0.9)
    t.opt = make_optimizer(list(t.params.values()), t.train_cfg)
    return t


def _state(t: TentativeStep) -> dict[str, torch.Tensor]:
    out = {k: v.clone() for k, v in t.live.items()}
    for i, p in enumerate(t.params.values()):
        for k, v in t.opt.state.get(p, {}).items():
            out[f"opt.{i}.{k}"] = v.clone() if torch.is_tensor(v) else torch.tensor(v)
    return out


def _forward_backward(t: TentativeStep, seed: int) -> None:
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(seed))
    t.segment.train()
    t.opt.zero_grad(set_to_none=True)
    t.segment(x).square().sum().backward()  # moves the BatchNorm statistics too


def _run(t: TentativeStep, s: int, here: bool = False) -> None:
    snapshot = t.begin(s)
    _forward_backward(t, s)
    t.prepared = snapshot()
    t.run_late(s, lambda: None, snapshot, ("alice", "s1", s + 1), here=here)


def test_rollback_restores_parameters_buffers_and_optimizer_state_bit_for_bit():
    t = _step()
    _run(t, 0)
    assert t.settle() is None
    t.prepared = None  # committed: momentum buffers exist now
    before = _state(t)
    _run(t, 1)
    assert t.settle() is None and any(not torch.equal(before[k], v) for k, v in _state(t).items())
    t.abort(1)
    after = _state(t)
    assert t.prepared is None and after.keys() == before.keys()
    assert all(torch.equal(after[k], v) for k, v in before.items())
    t.close()


def test_a_failed_late_check_is_rolled_back_reported_and_refused_until_aborted():
    t = _step()
    _run(t, 0, here=True)  # on the calling thread, as the first party does: still a late vote
    assert t.settle() is None
    t.prepared = None
    before = _state(t)
    t.bound["limit"] = 1e-9
    _run(t, 1)
    failed = t.settle()
    assert failed is not None and failed.step == 1 and failed.request == ("alice", "s1", 2)
    assert "max_abs_param" in failed.reason and "rolled back" in failed.reason
    assert t.prepared is None and all(torch.equal(_state(t)[k], v) for k, v in before.items())
    with pytest.raises(StepRolledBack):
        t.refuse_rolled_back(1)
    t.refuse_rolled_back(0)  # another step: not refused
    t.abort(1)
    t.refuse_rolled_back(1)  # aborted everywhere: the step may run again
    t.close()


def test_the_check_names_the_culprit_and_refuses_non_finite_updates():
    t = _step()
    t.check(0)  # within the bound
    with torch.no_grad():
        t.params["2.weight"][0, 0] = float("nan")
    with pytest.raises(NumericError, match=r"2\.weight"):
        t.check(3)
    t.close()


def test_a_starved_late_part_moves_the_next_ones_to_normal_priority():
    t = TentativeStep("bob", nn.Linear(2, 2), lambda: 1e6, update_priority="idle")
    t.train_cfg = TrainConfig(optimizer="sgd", lr=0.1)
    t.opt = make_optimizer(list(t.params.values()), t.train_cfg)
    idle_pool = t.late_pool()
    snapshot = t.begin(0)
    t.late_update(0, lambda: time.sleep(0.15), snapshot)  # waits without using CPU
    assert t.update_priority.startswith("normal (the late part of step 0 took")
    assert t.late_pool() is not idle_pool and t.late_pool() is t.late_pool()
    t.close()
