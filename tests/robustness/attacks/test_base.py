"""Every attack stays inside its budget and the box, beats a random perturbation of the same size, leaves the model as it found it and declares its threat model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from modelward.errors import ConfigError
from modelward.robustness.attacks import make_attack
from modelward.robustness.attacks.base import attack_mode, predict

torch.set_num_threads(1)  # the CI box is shared; oversubscribed BLAS threads are 10-50x slower

EPS = 0.15
TOL = 1e-5


def _rand_success(model: nn.Module, x: torch.Tensor, y: torch.Tensor, delta: torch.Tensor) -> float:
    return float((predict(model, (x + delta).clamp(0, 1)) != y).float().mean())


def _in_box(x_adv: torch.Tensor) -> bool:
    return bool(x_adv.min() >= 0.0) and bool(x_adv.max() <= 1.0)


@pytest.mark.parametrize("name,params", [
    ("fgsm", {}), ("bim", {}), ("pgd", {"steps": 20}), ("pgd", {"steps": 20, "restarts": 2}),
])
def test_linf_attacks_respect_eps_and_beat_random(victim, batch, name, params):
    x, y = batch
    res = make_attack(name, victim, eps=EPS, **params)(x, y)
    assert res.x_adv.shape == x.shape and res.success.dtype == torch.bool
    assert (res.x_adv - x).abs().max() <= EPS + TOL
    assert _in_box(res.x_adv)
    g = torch.Generator().manual_seed(1)
    rand = EPS * (torch.randint(0, 2, x.shape, generator=g) * 2 - 1).float()
    assert res.success_rate > _rand_success(victim, x, y, rand) + 0.3
    # the success mask is the truth about the returned inputs (exact: the same forward pass on the same batch)
    assert torch.equal(res.success, predict(victim, res.x_adv) != y)


@pytest.mark.parametrize("name,params", [("cw", {"steps": 50, "binary_steps": 4, "lr": 0.05}),
                                         ("lbfgs", {"max_iter": 30, "binary_steps": 4})])
def test_min_norm_attacks_stay_in_box_and_beat_random(victim, batch, name, params):
    x, y = batch[0][:25], batch[1][:25]
    res = make_attack(name, victim, **params)(x, y)
    assert _in_box(res.x_adv)
    assert res.success_rate >= 0.9
    norms = (res.x_adv - x).flatten(1).norm(dim=1).view(-1, 1, 1, 1)
    g = torch.Generator().manual_seed(2)
    d = torch.randn(x.shape, generator=g)
    d = d / d.flatten(1).norm(dim=1).view(-1, 1, 1, 1) * norms
    assert res.success_rate > _rand_success(victim, x, y, d) + 0.5


def test_attack_restores_model_state(victim, batch):
    x, y = batch
    victim.train()
    make_attack("pgd", victim, eps=0.1, steps=2)(x, y)
    assert victim.training and all(p.requires_grad for p in victim.parameters())
    victim.eval()
    with attack_mode(victim):
        assert not victim.training


def test_attacks_declare_their_threat_model():
    from modelward.robustness.attacks import threat_model

    assert threat_model("pgd") == threat_model("pgd", {"norm": "linf"})
    assert threat_model("pgd", {"norm": "l2"}).norm == "l2" and threat_model("fgsm", {"norm": "l2"}).takes_eps
    assert threat_model("bim").norm == "linf" and threat_model("ilcm").takes_eps
    for name, norm in (("cw", "l2"), ("lbfgs", "l2"), ("jsma", "l0")):
        tm = threat_model(name)
        assert tm.norm == norm and not tm.takes_eps
    with pytest.raises(ConfigError, match="bim"):
        threat_model("bim", {"norm": "l2"})


