"""Issue 38 item 3: AutoAttack's Square is the reference algorithm, point by point.

torchattacks' ``Square`` is a copy of the original AutoAttack code (fra31/auto-attack); on one-channel images the
two agree exactly (bench/square_reference.py also runs the original, for three channels too). Before the fix
modelward's Square drew window corners up to h − s (the reference stops at h − s − 1) and signs per point, and broke
10 (L∞) and 7 (ℓ2) more of these 60 digits at 1,000 queries; that variant lives on as ``square_full``.
"""

from __future__ import annotations

import pytest
import torch

from modelward.robustness.attacks import Square, make_attack
from modelward.robustness.attacks.base import predict

torch.set_num_threads(1)


@pytest.mark.parametrize("norm,eps", [("linf", 0.1), ("l2", 0.8)])
def test_square_equals_torchattacks_point_by_point(victim, batch, norm, eps):
    torchattacks = pytest.importorskip("torchattacks", reason="torchattacks is the reference (modelward[bench])")
    x, y = batch
    ours = Square(victim, eps=eps, norm=norm, n_queries=300, seed=0)(x, y)
    ref = torchattacks.Square(victim, norm="Linf" if norm == "linf" else "L2", eps=eps, n_queries=300, seed=0)(x, y)
    victim.eval()
    assert torch.equal(ours.success, predict(victim, ref) != y)
    assert 0 < int(ours.success.sum()) < len(y)
    # same process, same kernels, same random stream and batch order: the same iterates (a 1e-6 slack for the final
    # projection onto the ε-ball, which torchattacks does not apply)
    assert torch.allclose(ours.x_adv, ref, atol=1e-6)
    # the stronger variant is kept under its own name, and is stronger here
    full = make_attack("square_full", victim, eps=eps, norm=norm, n_queries=300, seed=0)(x, y)
    assert int(full.success.sum()) > int(ours.success.sum())


def test_square_runs_where_the_reference_cannot(victim, batch):
    """Rows (N×d) are attacked as 1×1×d images; ℓ2 on images under 5 pixels a side starts from 1-pixel cells."""
    x, y = batch[0][:20], batch[1][:20]
    rows = Square(torch.nn.Sequential(*list(victim)[1:]), eps=0.2, n_queries=100)(x.flatten(1), y)
    assert rows.x_adv.shape == (20, 64) and float((rows.x_adv - x.flatten(1)).abs().max()) <= 0.2 + 1e-6
    small = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
    res = Square(small, eps=0.5, norm="l2", n_queries=50)(torch.rand(6, 1, 4, 4), torch.randint(3, (6,)))
    assert float((res.x_adv.flatten(1) - res.x_adv.flatten(1)).abs().max()) == 0.0
