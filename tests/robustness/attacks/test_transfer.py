"""TransferAttack honours the EvasionAttack seeding contract: results depend on `seed` only, global RNG untouched."""

import torch
from torch import nn

from modelward.robustness.attacks import make_attack
from modelward.robustness.attacks.base import predict
from modelward.robustness.attacks.transfer import TransferAttack


def _victim() -> torch.nn.Module:
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(6, 3)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(3, 6, generator=g))
        lin.bias.zero_()
    return lin.eval()


def test_transfer_attack_depends_on_its_seed_only() -> None:
    x = torch.rand(40, 6, generator=torch.Generator().manual_seed(1))
    y = _victim()(x).argmax(1)
    outs = []
    for global_seed in (5, 6):
        victim = _victim()
        torch.manual_seed(global_seed)
        before = torch.get_rng_state()
        attack = TransferAttack(victim, eps=0.2, proxy_hidden=[8], proxy_steps=20, seed=3,
                                attack_params={"steps": 3})
        outs.append(attack(x, y).x_adv)
        assert torch.equal(torch.get_rng_state(), before)  # the caller's global RNG is not touched
    assert torch.equal(outs[0], outs[1])  # the proxy no longer depends on the global RNG state


torch.set_num_threads(1)  # the CI box is shared; oversubscribed BLAS threads are 10-50x slower

EPS = 0.15
TOL = 1e-5


def _rand_success(model: nn.Module, x: torch.Tensor, y: torch.Tensor, delta: torch.Tensor) -> float:
    return float((predict(model, (x + delta).clamp(0, 1)) != y).float().mean())


def _in_box(x_adv: torch.Tensor) -> bool:
    return bool(x_adv.min() >= 0.0) and bool(x_adv.max() <= 1.0)


def test_transfer_attack_through_proxy(digits_xy, victim, batch):
    x, y = batch
    xq = digits_xy[0][:1000]
    atk = make_attack("transfer", victim, eps=EPS, x_query=xq, proxy_steps=300, attack_params={"steps": 10})
    res = atk(x, y)
    assert atk.queries == len(xq)
    assert atk.proxy_agreement(digits_xy[0][1400:]) > 0.8
    assert (res.x_adv - x).abs().max() <= EPS + TOL and _in_box(res.x_adv)
    g = torch.Generator().manual_seed(1)
    rand = EPS * (torch.randint(0, 2, x.shape, generator=g) * 2 - 1).float()
    assert res.success_rate > _rand_success(victim, x, y, rand) + 0.2
    # black-box should not beat white-box PGD by much (gradient-masking sanity, digest §9.1)
    white = make_attack("pgd", victim, eps=EPS, steps=10)(x, y)
    assert res.success_rate <= white.success_rate + 0.05


