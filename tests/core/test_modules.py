"""core.modules: eval mode restores each module's flag (and requires_grad where asked), also on error; the public
entry points that used to flatten a user's frozen BatchNorm with ``model.train(was)`` now leave it frozen."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

from modelward.core.device import model_device as model_device_compat
from modelward.core.modules import batched_logits, eval_mode, model_device
from modelward.robustness.attacks.base import attack_mode


def _frozen_bn_net(out: int = 3) -> nn.Sequential:
    """A net in training mode whose BatchNorm the user froze (running statistics kept), one frozen parameter."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, out)).train()
    net[1].eval()
    net[1].weight.requires_grad_(False)
    return net


def _state(net: nn.Module) -> tuple[list[bool], list[bool]]:
    return [m.training for m in net.modules()], [p.requires_grad for p in net.parameters()]


def test_eval_mode_restores_each_flag_and_requires_grad_even_on_error() -> None:
    net = _frozen_bn_net()
    before = _state(net)
    with eval_mode(net, frozen_params=True):
        assert not any(m.training for m in net.modules())
        assert not any(p.requires_grad for p in net.parameters())
    assert _state(net) == before
    with pytest.raises(RuntimeError, match="boom"), attack_mode(net):
        raise RuntimeError("boom")
    assert _state(net) == before
    with eval_mode(net):  # without frozen_params the gradient flags are untouched
        assert [p.requires_grad for p in net.parameters()] == before[1]
    assert _state(net) == before


def test_model_device_and_batched_logits() -> None:
    net = _frozen_bn_net()
    assert model_device(net) == model_device_compat(net) == torch.device("cpu")
    assert model_device(nn.ReLU()) == torch.device("cpu")
    x = torch.randn(7, 4)
    with torch.no_grad(), eval_mode(net):
        want = net(x)
    got = batched_logits(net, x, batch_size=3)
    # equal up to float32 rounding, not bit for bit: batches of 3 and of 7 go through GEMMs that MKL/oneDNN block
    # by shape and CPU (equal on AVX-512 here, 1 ulp apart with ATEN_CPU_CAPABILITY=default or on AMX), so
    # assert_close's float32 defaults (rtol 1.3e-6, atol 1e-5: a few ulps of these O(1) logits)
    torch.testing.assert_close(got, want)
    assert batched_logits(net, torch.zeros(0, 4)).numel() == 0
    assert net[1].training is False and net.training is True


def _gloro_net() -> nn.Module:
    from modelward.robustness.gloro import GloroNet

    torch.manual_seed(0)
    f = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3))
    f[1].eval()  # GloRo bounds a BatchNorm only in eval mode: the user froze it
    net = GloroNet(f, (4,), epsilon=0.1)
    net.train()
    f[1].eval()
    return net


def _entry_points() -> list[tuple[str, Callable[[], nn.Module], Callable[[nn.Module], object]]]:
    from modelward.extraction.attacks.base import EvalSet, accuracy_and_fidelity
    from modelward.rl.dqn import q_policy
    from modelward.robustness.gloro.certify import certified_radius, certify, empirical_lipschitz
    from modelward.robustness.gloro.lipschitz import LipschitzBound

    x, y = torch.randn(8, 4), torch.randint(3, (8,))
    return [
        ("extraction.accuracy_and_fidelity", _frozen_bn_net,
         lambda m: accuracy_and_fidelity(m, EvalSet(x, y, y), batch_size=3)),
        ("gloro.certify", _gloro_net, lambda m: certify(m, x, y)),
        ("gloro.certified_radius", _gloro_net, lambda m: certified_radius(m, x)),
        ("gloro.empirical_lipschitz", _frozen_bn_net, lambda m: empirical_lipschitz(m, x, n_pairs=4, steps=2)),
        ("gloro.LipschitzBound", _frozen_bn_net, lambda m: LipschitzBound(list(m.named_children()), (4,))),
        ("rl.q_policy", _frozen_bn_net, lambda m: q_policy(m, 3, 0.0, 0)(np.zeros((2, 4), np.float32), [0, 1])),
    ]


@pytest.mark.parametrize("name", [n for n, _, _ in _entry_points()])
def test_a_users_frozen_batchnorm_stays_frozen_after_each_entry_point(name: str) -> None:
    _, build, call = next(e for e in _entry_points() if e[0] == name)
    net = build()
    before = _state(net)
    assert net.training and any(not m.training for m in net.modules())  # a mixed-mode model to begin with
    call(net)
    assert _state(net) == before, name


def test_the_evaluations_without_finally_now_restore_on_error() -> None:
    from modelward.core.train import evaluate
    from modelward.privacy.shadows import logits_of

    net = _frozen_bn_net()
    before = _state(net)
    for run in (lambda: evaluate(net, torch.randn(4, 5), torch.zeros(4, dtype=torch.long)),
                lambda: logits_of(net, torch.randn(4, 5))):  # wrong width: the forward pass raises
        with pytest.raises(RuntimeError):
            run()
        assert _state(net) == before
