"""Input privacy (issue 36 item 4): Alice's [input_protection] (keyed activation noise, NoPeek) and Bob's
reconstruction attacks, checked against an independent implementation of the decoder attack written here."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError
from modelward.governance.leakage.inputs import ATTACK_SEED, _train, split_rows
from modelward.governance.leakage.inversion import baselines, decoder_attack, reconstruction_scores
from modelward.governance.party.input_protection import (
    InputProtection,
    InputProtectionConfig,
    distance_correlation,
)
from modelward.governance.party.label_protection import LabelProtectionConfig
from modelward.governance.plan import segment_of
from modelward.governance.wire import decode


def test_noise_is_keyed_by_the_secret_and_the_row_content():
    x = torch.rand(6, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    x[3] = x[1]  # the same input in two rows
    h = torch.rand(6, 16, 4, 4, generator=torch.Generator().manual_seed(1)) + 0.5
    h[3] = h[1]  # (its activation too)
    a = InputProtection(InputProtectionConfig(noise=0.5))
    s1, s2 = a.outgoing(h, x, step=1), a.outgoing(h, x, step=7)
    assert torch.equal(s1, s2)  # the same input gets the same noise at every step: nothing fresh to average
    n = s1 - h
    assert torch.equal(n[1], n[3]) and not torch.allclose(n[0], n[1])
    rms = h.reshape(6, -1).pow(2).mean(1).sqrt()
    ratio = n.reshape(6, -1).std(1) / rms
    assert ((ratio > 0.4) & (ratio < 0.6)).all(), ratio  # sigma x the row's RMS (256 draws per row)
    other = InputProtection(InputProtectionConfig(noise=0.5)).outgoing(h, x, step=1)
    assert not torch.allclose(other, s1)  # another secret (each party's own, from the OS CSPRNG)
    off = InputProtection(InputProtectionConfig())
    assert not off.active and torch.equal(off.outgoing(h, x, 1), h) and torch.equal(off.incoming(h, 1), h)


def test_distance_correlation_and_the_nopeek_term():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 10, generator=g, dtype=torch.float64)
    assert float(distance_correlation(x, 3 * x + 1)) == pytest.approx(1.0, abs=1e-6)
    u = torch.randn(1000, 1, generator=g, dtype=torch.float64)  # (the V-statistic's bias shrinks with the rows)
    assert float(distance_correlation(u, torch.randn(1000, 1, generator=g, dtype=torch.float64))) < 0.1
    assert float(distance_correlation(u, u ** 2)) > 0.4  # uncorrelated, yet dependent: dCor sees it
    z = torch.randn(16, 4, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: distance_correlation(x[:16], t), (z,))
    # NoPeek: alpha * d dCor / dh joins the received gradient once, for its step
    p = InputProtection(InputProtectionConfig(nopeek=0.5))
    h = torch.randn(16, 4, generator=g)
    p.outgoing(h, x[:16].float(), step=3)
    hh = h.clone().requires_grad_(True)
    (want,) = torch.autograd.grad(distance_correlation(x[:16].float(), hh), hh)
    g0 = torch.zeros_like(h)
    assert torch.allclose(p.incoming(g0, 3), 0.5 * want, atol=1e-6)
    assert torch.equal(p.incoming(g0, 3), g0)  # (taken once)


def test_alice_s_protection_in_the_chain(make_chain):
    """What reaches Bob is Alice's activation plus her keyed noise, the same for a retried step; a party that is
    not the first cannot be configured with it."""
    c = make_chain(extra={"alice": {"input_protection": {"noise": 0.5, "nopeek": 0.1}}})
    bob = c.parties["bob"]
    seen: list[torch.Tensor] = []
    handle = bob.handle

    def spy(caller, data):
        msg = decode(data, max_bytes=2**30, allow_nonfinite=True)
        if msg.op == "step":
            seen.append(msg.tensors["h"])
        return handle(caller, data)

    bob.handle = spy
    drv = c.driver(TrainConfig(steps=1, batch_size=16, lr=0.05), pipeline=False)
    drv.open(train=True)
    alice = c.parties["alice"]
    x = c.data.x_train[:16]
    with torch.no_grad():  # the activation the step sends, before the step's own update changes Alice's part
        alice.segment.train()
        clean = alice.segment(x)
    drv.call("alice", "step", 0, {}, {"idx": torch.arange(16)})
    drv.call("alice", "abort", 0, {}, {})
    drv.call("bob", "abort", 0, {}, {})
    drv.call("alice", "step", 0, {}, {"idx": torch.arange(16)})
    assert len(seen) == 2 and torch.equal(seen[0], seen[1])  # the retry sends the same noisy activation
    rms = clean.reshape(16, -1).pow(2).mean(1).sqrt()
    diff = (seen[0] - clean).reshape(16, -1).std(1) / rms
    assert ((diff > 0.3) & (diff < 0.7)).all(), diff
    with pytest.raises(ConfigError, match="only the first party"):
        c.restart("bob", ["input_protection.noise=0.5"])


def independent_decoder(alice_like, bob: nn.Module, aux_x, aux_y, received, steps: int, seed: int) -> torch.Tensor:
    """He et al.'s query-free attack written again, differently: surrogate and decoder trained *jointly* (one
    loss: Bob's classification through the surrogate + the features' moments + the reconstruction through the
    detached surrogate), sampling batches with replacement; a convolutional decoder for images, an MLP otherwise.
    (Also used by bench/input_leakage_crosscheck.py on digits.)"""
    torch.manual_seed(seed)
    sur = alice_like()
    feat = received[0].numel()
    if aux_x.dim() == 4:
        dec: nn.Module = nn.Sequential(nn.Flatten(), nn.Linear(feat, 32 * 4 * 4), nn.ReLU(), nn.Unflatten(1, (32, 4, 4)),
                                       nn.ConvTranspose2d(32, 16, 4, stride=2, padding=1), nn.ReLU(),
                                       nn.Conv2d(16, aux_x.shape[1], 3, padding=1), nn.Sigmoid())
    else:
        dec = nn.Sequential(nn.Flatten(), nn.Linear(feat, 256), nn.Tanh(), nn.Linear(256, aux_x.shape[1]))
    for p in bob.parameters():
        p.requires_grad_(False)
    bob.eval()
    opt = torch.optim.Adam([*sur.parameters(), *dec.parameters()], lr=1e-3)
    target = received.reshape(len(received), -1)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        i = torch.randint(0, len(aux_x), (64,), generator=g)
        f = sur(aux_x[i])
        ff = f.reshape(64, -1)
        moments = ((ff.mean(0) - target.mean(0)) ** 2).mean() + ((ff.std(0) - target.std(0)) ** 2).mean()
        loss = (F.cross_entropy(bob(f), aux_y[i]) + moments / target.std(0).mean() ** 2
                + F.mse_loss(dec(f.detach()), aux_x[i]))
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return dec(received)


@pytest.mark.slow
def test_the_decoder_attack_agrees_with_an_independent_implementation(digits):
    """On a small digits split (Alice: conv1 with 4 channels), Bob's query-free decoder recovers Alice's private
    images far above the no-leak references, and the independent implementation above, on the same activations,
    lands within a few SSIM points (bench/input_leakage_crosscheck.py compares them on the audit's own split and
    budgets)."""
    torch.set_num_threads(1)
    mc = ModelConfig(arch="cnn", channels=[4, 8], fc=16)
    tc = TrainConfig(optimizer="sgd", lr=0.05, momentum=0.9, batch_size=64, steps=120)
    private, aux = split_rows(len(digits.x_train), 0.3, 0)
    run = _train(digits, mc, "conv1", tc, InputProtectionConfig(), LabelProtectionConfig(method="marvell", scale=4),
                 private, aux[:0], seed=0)
    rows = torch.arange(0, len(private), 8)[:128]
    x, received = digits.x_train[private][rows], torch.stack([run.last[int(i)] for i in rows])
    aux_x, aux_y = digits.x_train[aux], digits.y_train[aux]

    def alice_like():
        return segment_of(build_model(mc, (1, 8, 8), 10), run.plan.owners["alice"], "alice")

    ours = reconstruction_scores(x, decoder_attack(alice_like, run.bob, aux_x, aux_y, received, True,
                                                   surrogate_steps=500, decoder_steps=500,
                                                   seed=ATTACK_SEED), True)["ssim"]
    theirs = reconstruction_scores(x, independent_decoder(alice_like, run.bob, aux_x, aux_y, received, 800,
                                                          ATTACK_SEED + 1), True)["ssim"]
    ref = baselines(x, aux_x, x, True)
    assert min(ours, theirs) > max(ref["mean_ssim"], ref["other_ssim"]) + 0.3, (ours, theirs, ref)
    assert abs(ours - theirs) < 0.06, (ours, theirs)
