"""V-trace (IMPALA Eq. 1) against a hand-computed example and its on-policy special case."""

import math

import torch

from modelward.rl.vtrace import vtrace


def test_vtrace_hand_computed():
    # T = 2, one environment, γ = 0.9; π/μ = 0.25/0.5 = 0.5 at t=0 and 1.0/0.8 = 1.25 at t=1; ρ̄ = c̄ = 1
    # ρ = (0.5, 1), c = (0.5, 1)
    # δ0 = 0.5·(1 + 0.9·1.0 − 0.5) = 0.7 ;  δ1 = 1·(2 + 0.9·2.0 − 1.0) = 2.8
    # v1 = V1 + δ1 = 3.8 ;  v0 = V0 + δ0 + γ·c0·(v1 − V1) = 0.5 + 0.7 + 0.9·0.5·2.8 = 2.46
    # A0 = ρ0·(r0 + γ·v1 − V0) = 0.5·(1 + 3.42 − 0.5) = 1.96 ;  A1 = 1·(2 + 0.9·2.0 − 1.0) = 2.8
    col = lambda *x: torch.tensor(x, dtype=torch.float64).view(-1, 1)  # noqa: E731
    out = vtrace(behaviour_logp=col(math.log(0.5), math.log(0.8)), target_logp=col(math.log(0.25), 0.0),
                 rewards=col(1.0, 2.0), values=col(0.5, 1.0), bootstrap=torch.tensor([2.0], dtype=torch.float64),
                 discounts=col(0.9, 0.9))
    assert torch.allclose(out.vs, col(2.46, 3.8))
    assert torch.allclose(out.pg_advantages, col(1.96, 2.8))
    # an episode end at t=0 (γ_0 = 0) cuts the trace: v0 = V0 + ρ0·(r0 − V0) = 0.5 + 0.5·0.5 = 0.75
    cut = vtrace(col(math.log(0.5), math.log(0.8)), col(math.log(0.25), 0.0), col(1.0, 2.0), col(0.5, 1.0),
                 torch.tensor([2.0], dtype=torch.float64), col(0.0, 0.9))
    assert math.isclose(float(cut.vs[0, 0]), 0.75)
    # truncation levels above the ratios: no clipping, c0 = 0.5 still, ρ1 = 1.25
    loose = vtrace(col(math.log(0.5), math.log(0.8)), col(math.log(0.25), 0.0), col(1.0, 2.0), col(0.5, 1.0),
                   torch.tensor([2.0], dtype=torch.float64), col(0.9, 0.9), rho_bar=10.0, c_bar=10.0)
    assert math.isclose(float(loose.vs[1, 0]), 1.0 + 1.25 * 2.8)


def test_on_policy_vtrace_is_the_n_step_return():
    g = torch.Generator().manual_seed(0)
    t, n, gamma = 5, 3, 0.95
    r, v = torch.randn(t, n, generator=g), torch.randn(t, n, generator=g)
    boot = torch.randn(n, generator=g)
    done = torch.zeros(t, n)
    done[2, 1] = 1.0
    disc = gamma * (1 - done)
    logp = torch.log(torch.rand(t, n, generator=g))
    out = vtrace(logp, logp, r, v, boot, disc)
    ret, expected = boot, torch.empty(t, n)
    for i in reversed(range(t)):
        ret = r[i] + disc[i] * ret
        expected[i] = ret
    assert torch.allclose(out.vs, expected, atol=1e-6)
