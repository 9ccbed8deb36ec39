import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from modelward.core.data import DataConfig, load_data
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig
from modelward.errors import ConfigError, DataError
from modelward.governance.leakage.attacks import LeakageMeter, auc, batch_leakage, pairwise_auc
from modelward.governance.leakage.study import simulate_split
from modelward.governance.party.label_protection import (
    LabelProtectionConfig,
    marvell_variances,
    protect_gradient,
)


def _binary_grads(n=200, d=32, frac_pos=0.2, seed=0):
    """Gradients of a binary softmax head: g_i = (p_i - y_i) (w1 - w0) + small per-example variation."""
    g = torch.Generator().manual_seed(seed)
    y = (torch.rand(n, generator=g) < frac_pos).long()
    w = torch.randn(d, generator=g)
    p = torch.where(y == 1, 0.2 + 0.2 * torch.rand(n, generator=g), 0.05 + 0.1 * torch.rand(n, generator=g))
    grad = (p - y.double())[:, None] * w[None, :] + 0.01 * torch.randn(n, d, generator=g)
    return grad.float(), y


def test_auc_matches_sklearn_with_ties():
    rng = np.random.default_rng(0)
    s = rng.integers(0, 5, 300).astype(float)
    y = rng.random(300) < 0.3
    assert auc(s, y) == pytest.approx(roc_auc_score(y, s))
    assert np.isnan(auc(s, np.zeros(300, bool)))


def test_attacks_recover_binary_labels_and_marvell_hides_them():
    grad, y = _binary_grads()
    leak = batch_leakage(grad, y, 2, positive=1)
    assert leak["direction_auc"] > 0.99 and leak["pairwise_auc"] > 0.99  # Li et al.: cosine separates the classes
    assert leak["norm_auc"] > 0.95  # the minority class has the larger |p - y|
    gen = torch.Generator().manual_seed(1)
    for method in ("marvell", "isotropic"):
        sent = protect_gradient(grad, y, LabelProtectionConfig(method=method, scale=16.0), generator=gen)
        prot = batch_leakage(sent, y, 2, positive=1)
        assert prot["direction_auc"] < 0.7 and prot["norm_auc"] < 0.75, (method, prot)


def test_protection_shapes_budget_and_randomness():
    grad, y = _binary_grads(n=400, d=64)
    img = grad.reshape(400, 4, 4, 4).contiguous(memory_format=torch.channels_last)
    cfg0 = LabelProtectionConfig()
    assert protect_gradient(img, y, cfg0) is img
    assert protect_gradient(img, y, LabelProtectionConfig(method="marvell", scale=0.0)) is img
    delta = grad[y == 1].double().mean(0) - grad[y == 0].double().mean(0)
    signal = float(delta @ delta)
    for method in ("isotropic", "marvell"):
        cfg = LabelProtectionConfig(method=method, scale=4.0)
        out = protect_gradient(img, y, cfg, generator=torch.Generator().manual_seed(0))
        assert out.shape == img.shape and out.dtype == img.dtype
        noise = (out - img).reshape(400, -1).double()
        power = float((noise ** 2).sum(1).mean())
        assert power == pytest.approx(4.0 * signal, rel=0.2), method
        if method == "marvell":  # the optimised noise goes where the labels are: along the class-mean difference
            along = float(((noise @ (delta / delta.norm())) ** 2).mean())
            assert along > 0.5 * power
    a = protect_gradient(grad, y, LabelProtectionConfig(method="isotropic", scale=1.0))
    b = protect_gradient(grad, y, LabelProtectionConfig(method="isotropic", scale=1.0))
    assert not torch.equal(a, b)  # Bob's own secret randomness by default
    c = protect_gradient(grad, y, LabelProtectionConfig(method="isotropic", scale=1.0, seed=3))
    assert torch.equal(c, protect_gradient(grad, y, LabelProtectionConfig(method="isotropic", scale=1.0, seed=3)))
    d = protect_gradient(grad, y, {"method": "isotropic", "scale": 1.0, "seed": 3})  # the TOML table as a dict
    assert torch.equal(c, d) and protect_gradient(grad, y, None) is grad
    with pytest.raises(ConfigError, match=r"method.*marvell"):
        protect_gradient(grad, y, {"method": "laplace"})
    with pytest.raises(DataError, match="labels for a batch"):
        protect_gradient(grad, y[:-1], LabelProtectionConfig(method="marvell", scale=1.0))


def test_marvell_allocation_respects_budget_and_beats_even_spending():
    p, u, d2 = np.array([0.8, 0.2]), np.array([1e-4, 4e-4]), np.array([[0.0, 1.0], [1.0, 0.0]])
    a, b = marvell_variances(p, u, d2, dim=32, rank=1, power=4.0)
    assert (a >= 0).all() and (b >= 0).all()
    assert float(p @ (a + 31 * b)) <= 4.0 * (1 + 1e-6)

    def sym_kl(a, b):
        va, vb = u + a, u + b
        r, t = va[0] / va[1], vb[0] / vb[1]
        return 0.5 * (r + 1 / r + 31 * (t + 1 / t) + 1.0 * (1 / va[0] + 1 / va[1]) - 64)

    assert sym_kl(a, b) <= sym_kl(np.array([4.0, 4.0]), np.zeros(2)) + 1e-9
    assert sym_kl(a, b) < sym_kl(np.full(2, 4.0 / 32), np.full(2, 4.0 / 32))  # better than isotropic noise


def test_multiclass_meter_accumulates_over_epochs():
    g = torch.Generator().manual_seed(0)
    protos = torch.randn(5, 16, generator=g)
    y = torch.arange(100) % 5
    meter = LeakageMeter(5, seed=0)
    for epoch in range(4):
        perm = torch.randperm(100, generator=g)
        for k in range(0, 100, 25):
            idx = perm[k:k + 25]
            grad = protos[y[idx]] + 3.0 * torch.randn(25, 16, generator=g)  # noisy per step
            meter.update(grad, y[idx], epoch, idx)
    s = meter.summary()
    assert 0.5 < s["direction_auc"] < s["direction_auc_acc"]  # averaging over epochs removes fresh noise
    assert s["direction_accuracy_acc"] > s["direction_accuracy"] > 0.2
    assert pairwise_auc(protos[y], y) == 1.0


def test_split_training_leaks_breast_cancer_labels_and_protection_stops_it():
    data = load_data(DataConfig(source="breast_cancer"))
    mc, tc = ModelConfig(arch="mlp", hidden=[32]), TrainConfig(steps=40, batch_size=32, lr=0.01)
    plain = simulate_split(data, mc, "fc1", tc, LabelProtectionConfig(), seed=0, positive=0)
    assert plain["direction_auc"] > 0.95 and plain["test_accuracy"] > 0.85
    prot = simulate_split(data, mc, "fc1", tc, LabelProtectionConfig(method="marvell", scale=16.0), seed=0,
                          positive=0)
    assert prot["direction_auc"] < 0.6 and prot["direction_auc_acc"] < 0.7
    assert prot["test_accuracy"] > 0.85


def test_party_config_validates_label_protection_at_load():
    from pathlib import Path

    from modelward.errors import ConfigError
    from modelward.governance.party.config import load_party_config

    bob = Path(__file__).resolve().parents[2] / "examples" / "party_bob.toml"
    cfg = load_party_config(bob, ["label_protection.method=marvell", "label_protection.scale=4"])
    assert cfg.label_protection == LabelProtectionConfig(method="marvell", scale=4.0)
    with pytest.raises(ConfigError, match=r"label_protection\.method.*'marvell'"):
        load_party_config(bob, ["label_protection.method=marvel"])


def test_keyed_noise_repeats_for_a_retried_step_and_differs_across_steps():
    grad, y = _binary_grads(n=64, d=16)
    idx = torch.arange(100, 164)
    cfg = LabelProtectionConfig(method="marvell", scale=4.0)
    a = protect_gradient(grad, y, cfg, step=7, index=idx)
    assert torch.equal(a, protect_gradient(grad, y, cfg, step=7, index=idx))  # the retry gets the same noise
    assert not torch.equal(a, protect_gradient(grad, y, cfg, step=8, index=idx))
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(0))  # same examples, other order
    b = protect_gradient(grad[perm], y[perm], cfg, step=7, index=idx[perm])
    torch.testing.assert_close(b, a[perm], rtol=1e-4, atol=1e-4)  # up to the optimiser on permuted statistics
    with pytest.raises(DataError, match="indices"):
        protect_gradient(grad, y, cfg, step=7, index=idx[:3])


def test_abort_and_retry_gives_alice_no_fresh_noise(make_chain):
    """The two-phase protocol lets Alice's driver abort step s and run it again; Bob's state is restored bit for
    bit, so only keyed noise stops her from averaging fresh samples of the same gradient."""
    from modelward.governance.wire import Message

    c = make_chain(extra={"bob": {"label_protection": {"method": "marvell", "scale": 4.0}}})
    drv = c.driver(TrainConfig(steps=2, batch_size=16, lr=0.05))
    drv.open(train=True)
    bob = c.client("bob", "alice")
    bob.call(Message("open", drv.session))
    h = torch.rand(16, 4, 4, 4, generator=torch.Generator().manual_seed(0))
    idx = torch.arange(16)
    got = []
    for seq in (1, 2, 3):
        got.append(bob.call(Message("step", drv.session, 0, seq, {}, {"h": h, "idx": idx})).tensors["g"])
        drv.call("bob", "abort", 0, {}, {})
    assert torch.equal(got[0], got[1]) and torch.equal(got[1], got[2])
    c.parties["bob"].cfg.label_protection = None  # the same step unprotected: the noise was really there
    c.parties["bob"]._protect = None
    clean = bob.call(Message("step", drv.session, 0, 4, {}, {"h": h, "idx": idx})).tensors["g"]
    assert not torch.allclose(clean, got[0])
