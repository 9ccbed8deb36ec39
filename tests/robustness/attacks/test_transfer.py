"""TransferAttack honours the EvasionAttack seeding contract: results depend on `seed` only, global RNG untouched."""

import torch

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
