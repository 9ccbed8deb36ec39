"""AutoAttack and its members: budgets, box, honest success masks, seeding, APGD's schedule, FAB's projection
against an LP/QP solver, and agreement with torchattacks' AutoAttack (standard) on a small model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linprog, minimize

from modelward.errors import ConfigError
from modelward.robustness.attacks import APGD, APGDT, FAB, AutoAttack, Square, make_attack
from modelward.robustness.attacks.apgd import checkpoints
from modelward.robustness.attacks.base import predict
from modelward.robustness.attacks.fab import min_norm_to_hyperplane

torch.set_num_threads(1)  # the CI box is shared; oversubscribed BLAS threads are 10-50x slower
TOL = 1e-5


def _norms(d: torch.Tensor, norm: str) -> torch.Tensor:
    return d.flatten(1).abs().amax(1) if norm == "linf" else d.flatten(1).norm(dim=1)


def test_apgd_checkpoints_follow_the_paper():
    # p_0 = 0, p_1 = 0.22, p_{j+1} = p_j + max(p_j − p_{j−1} − 0.03, 0.06)
    assert checkpoints(100) == [22, 41, 57, 70, 80, 87, 93, 99]


@pytest.mark.parametrize("norm,eps", [("linf", 0.1), ("l2", 0.8)])
@pytest.mark.parametrize("cls,kw", [(APGD, {"steps": 20}), (APGD, {"steps": 20, "loss": "dlr"}),
                                    (APGDT, {"steps": 10, "n_target_classes": 3}),
                                    (FAB, {"steps": 10, "n_target_classes": 3}), (Square, {"n_queries": 200})])
def test_members_stay_in_budget_report_honestly_and_restore_the_model(victim, batch, norm, eps, cls, kw):
    x, y = batch[0][:30], batch[1][:30]
    victim.train()
    res = cls(victim, eps=eps, norm=norm, seed=3, **kw)(x, y)
    assert victim.training and all(p.requires_grad for p in victim.parameters())
    victim.eval()
    assert float(_norms(res.x_adv - x, norm).max()) <= eps + TOL
    assert float(res.x_adv.min()) >= 0.0 and float(res.x_adv.max()) <= 1.0
    assert torch.equal(res.success, predict(victim, res.x_adv) != y)  # the same pass on the same batch: exact
    assert res.success_rate > 0.3  # all of them break the undefended MLP at these budgets
    again = cls(victim, eps=eps, norm=norm, seed=3, **kw)(x, y)
    assert torch.equal(again.x_adv, res.x_adv)  # seeded


def test_apgd_beats_pgd_of_the_same_cost(victim, batch):
    x, y = batch
    apgd = APGD(victim, eps=0.05, steps=20)(x, y).success_rate
    pgd = make_attack("pgd", victim, eps=0.05, steps=20)(x, y).success_rate
    assert apgd >= pgd


@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_fab_projection_is_the_minimal_norm_point_of_the_hyperplane_in_the_box(norm):
    g = torch.Generator().manual_seed(0)
    n, d = 6, 7
    p = torch.rand(n, d, generator=g, dtype=torch.float64)
    w = torch.randn(n, d, generator=g, dtype=torch.float64)
    b = (w * torch.rand(n, d, generator=g, dtype=torch.float64)).sum(1)  # a hyperplane through a box point
    delta = min_norm_to_hyperplane(p, w, b, 0.0, 1.0, norm)
    assert torch.allclose((w * (p + delta)).sum(1), b, atol=1e-9)
    assert float((p + delta).min()) >= -1e-12 and float((p + delta).max()) <= 1 + 1e-12
    for i in range(n):
        pi, wi, bi = p[i].numpy(), w[i].numpy(), float(b[i])
        if norm == "linf":  # min t s.t. −t ≤ δ ≤ t, w·δ = b − w·p, box
            c = np.r_[np.zeros(d), 1.0]
            a_ub = np.block([[np.eye(d), -np.ones((d, 1))], [-np.eye(d), -np.ones((d, 1))]])
            res = linprog(c, A_ub=a_ub, b_ub=np.zeros(2 * d), A_eq=np.r_[wi, 0.0][None],
                          b_eq=[bi - wi @ pi], bounds=[(-v, 1 - v) for v in pi] + [(0, None)])
            best = res.fun
        else:
            cons = {"type": "eq", "fun": lambda z, wi=wi, bi=bi, pi=pi: wi @ (pi + z) - bi}
            res = minimize(lambda z: z @ z, np.zeros(d), constraints=[cons], method="SLSQP",
                           bounds=[(-v, 1 - v) for v in pi], options={"ftol": 1e-14, "maxiter": 500})
            best = float(np.sqrt(res.fun))
        assert float(_norms(delta[i : i + 1], norm)) == pytest.approx(best, rel=1e-5, abs=1e-7)


def test_autoattack_is_the_per_point_worst_case_and_records_who_broke_each_point(victim, batch):
    x, y = batch[0][:40], batch[1][:40]
    aa = AutoAttack(victim, eps=0.06, norm="linf", seed=0, steps=20, n_queries=300)
    res = aa(x, y)
    alone = APGD(victim, eps=0.06, steps=20, seed=0)(x, y)
    assert res.success_rate >= alone.success_rate  # APGD-CE runs first with the same seed, then the others add
    assert len(res.broken_by) == len(x)
    assert [b is not None for b in res.broken_by] == res.success.tolist()
    assert sum(res.counts().values()) == int(res.success.sum())
    with pytest.raises(ConfigError, match="choose among"):
        AutoAttack(victim, eps=0.1, attacks=("apgd-ce", "deepfool"))


@pytest.mark.parametrize("norm,eps", [("linf", 0.08), ("l2", 0.6)])
def test_autoattack_agrees_with_torchattacks(victim, batch, norm, eps):
    """Robust accuracy within ±0.5 point of torchattacks' AutoAttack(version="standard") with the same budget:
    100 iterations (the paper's standard; torchattacks' own default is 10), Square at 500 queries and 3 target
    classes to stay fast (5,000 and 9 in bench/autoattack.py). On 24 points both must break exactly as many."""
    torchattacks = pytest.importorskip("torchattacks", reason="torchattacks is the reference (make install adds it)")
    x, y = batch[0][:24], batch[1][:24]
    ours = 1 - AutoAttack(victim, eps=eps, norm=norm, seed=0, n_queries=500, n_target_classes=3)(x, y).success_rate
    ref = torchattacks.AutoAttack(victim, norm="Linf" if norm == "linf" else "L2", eps=eps, version="standard",
                                  n_classes=4, seed=0)  # n_classes − 1 = 3 target classes, as ours
    for member in ref._autoattack.attacks[:3]:
        member.steps = 100
    ref._autoattack.attacks[3].n_queries = 500
    theirs = float((predict(victim, ref(x, y)) == y).float().mean())
    assert 0.0 < ours < 1.0 and abs(ours - theirs) <= 0.005 + 1e-9, (ours, theirs)
