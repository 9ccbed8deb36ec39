"""Every attack stays inside its budget and the box, and beats a random perturbation of the same size."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

from modelward.errors import ConfigError
from modelward.robustness.attacks import ATTACK_NAMES, make_attack
from modelward.robustness.attacks.base import attack_mode, predict
from modelward.robustness.metrics import robust_accuracy, robustness_curve_plot

torch.set_num_threads(1)  # the CI box is shared; oversubscribed BLAS threads are 10-50x slower

EPS = 0.15
TOL = 1e-5


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    d = load_digits()
    return torch.tensor(d.data / 16, dtype=torch.float32).view(-1, 1, 8, 8), torch.tensor(d.target)


@pytest.fixture(scope="module")
def victim(digits) -> nn.Module:
    x, y = digits
    torch.manual_seed(0)
    m = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.Adam(m.parameters(), 1e-2)
    for _ in range(250):
        opt.zero_grad()
        F.cross_entropy(m(x[:1400]), y[:1400]).backward()
        opt.step()
    return m


@pytest.fixture(scope="module")
def batch(digits, victim) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = digits
    xs, ys = x[1400:], y[1400:]
    keep = predict(victim, xs) == ys  # attack only points the model gets right
    return xs[keep][:60], ys[keep][:60]


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
    # the success mask is the truth about the returned inputs
    assert torch.equal(res.success, predict(victim, res.x_adv) != y)


def test_l2_pgd_respects_ball_and_beats_random(victim, batch):
    x, y = batch
    eps = 1.0
    res = make_attack("pgd", victim, eps=eps, norm="l2", steps=20)(x, y)
    assert (res.x_adv - x).flatten(1).norm(dim=1).max() <= eps + TOL
    assert _in_box(res.x_adv)
    g = torch.Generator().manual_seed(1)
    d = torch.randn(x.shape, generator=g)
    d = d / d.flatten(1).norm(dim=1).view(-1, 1, 1, 1) * eps
    assert res.success_rate > _rand_success(victim, x, y, d) + 0.3


def test_ilcm_reaches_least_likely_class(victim, batch):
    x, y = batch
    with torch.no_grad():
        least = victim(x).argmin(1)
    atk = make_attack("ilcm", victim, eps=0.3, steps=20)
    assert torch.equal(atk.default_target(x, y), least)
    res = atk(x, y)
    assert (res.x_adv - x).abs().max() <= 0.3 + TOL
    assert torch.equal(res.success, predict(victim, res.x_adv) == least)
    assert res.success_rate > 0.3


def test_targeted_fgsm_raises_target_probability(victim, batch):
    x, y = batch
    target = (y + 1) % 10
    res = make_attack("fgsm", victim, eps=0.1, targeted=True)(x, y, target)
    with torch.no_grad():
        before = F.softmax(victim(x), 1).gather(1, target[:, None])
        after = F.softmax(victim(res.x_adv), 1).gather(1, target[:, None])
    assert float((after > before).float().mean()) > 0.9


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


def test_jsma_respects_l0_budget_and_beats_random(victim, batch):
    x, y = batch
    atk = make_attack("jsma", victim, gamma=0.1)
    res = atk(x, y)
    changed = ((res.x_adv - x).abs() > 0).flatten(1).sum(1)
    assert int(changed.max()) <= atk.max_features(x) == 6
    assert _in_box(res.x_adv)
    g = torch.Generator().manual_seed(3)
    idx = torch.rand(len(x), 64, generator=g).argsort(1)[:, :6]
    rand = x.flatten(1).clone()
    rand.scatter_(1, idx, 1.0)
    rand_success = float((predict(victim, rand.view_as(x)) != y).float().mean())
    assert res.success_rate > rand_success + 0.3


def test_transfer_attack_through_proxy(digits, victim, batch):
    x, y = batch
    xq = digits[0][:1000]
    atk = make_attack("transfer", victim, eps=EPS, x_query=xq, proxy_steps=300, attack_params={"steps": 10})
    res = atk(x, y)
    assert atk.queries == len(xq)
    assert atk.proxy_agreement(digits[0][1400:]) > 0.8
    assert (res.x_adv - x).abs().max() <= EPS + TOL and _in_box(res.x_adv)
    g = torch.Generator().manual_seed(1)
    rand = EPS * (torch.randint(0, 2, x.shape, generator=g) * 2 - 1).float()
    assert res.success_rate > _rand_success(victim, x, y, rand) + 0.2
    # black-box should not beat white-box PGD by much (gradient-masking sanity, digest §9.1)
    white = make_attack("pgd", victim, eps=EPS, steps=10)(x, y)
    assert res.success_rate <= white.success_rate + 0.05


def test_lbfgs_finds_minimum_norm_direction_on_linear_model():
    torch.manual_seed(0)
    lin = nn.Linear(10, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(2, 10))
        lin.bias.zero_()
    x = torch.rand(8, 10) * 0.2 + 0.4
    y = predict(lin, x)
    w = (lin.weight[1] - lin.weight[0]).detach()  # logit margin of class 1 over class 0 is w·x + b
    with torch.no_grad():
        margin = x @ w + (lin.bias[1] - lin.bias[0])
    r_star = -margin[:, None] * w[None] / w.dot(w)  # analytic minimum-norm perturbation to the boundary
    res = make_attack("lbfgs", lin, clip=(-10.0, 10.0), binary_steps=12, max_iter=100)(x, y)
    r = res.x_adv - x
    assert bool(res.success.all())
    cos = F.cosine_similarity(r, r_star, dim=1)
    assert float(cos.min()) > 0.999
    ratio = r.norm(dim=1) / r_star.norm(dim=1)
    assert float(ratio.min()) >= 1.0 - 1e-4 and float(ratio.max()) < 1.1


def test_cw_smaller_than_fgsm_at_equal_success(victim, batch):
    x, y = batch[0][:30], batch[1][:30]
    cw = make_attack("cw", victim, steps=60, binary_steps=5, lr=0.05)(x, y)
    # smallest FGSM ε reaching C&W's success rate
    for eps in [0.05 * k for k in range(1, 21)]:
        fg = make_attack("fgsm", victim, eps=eps)(x, y)
        if fg.success_rate >= cw.success_rate:
            break
    assert fg.success_rate >= cw.success_rate
    l2_cw = (cw.x_adv - x).flatten(1).norm(dim=1)[cw.success].mean()
    l2_fg = (fg.x_adv - x).flatten(1).norm(dim=1)[fg.success].mean()
    assert l2_cw < 0.8 * l2_fg


def test_attack_restores_model_state(victim, batch):
    x, y = batch
    victim.train()
    make_attack("pgd", victim, eps=0.1, steps=2)(x, y)
    assert victim.training and all(p.requires_grad for p in victim.parameters())
    victim.eval()
    with attack_mode(victim):
        assert not victim.training


def test_robust_accuracy_curve_is_monotone(victim, batch, tmp_path):
    x, y = batch
    pts = robust_accuracy(victim, x, y, "pgd", [0.0, 0.05, 0.1, 0.2], {"steps": 10})
    assert pts[0].robust_accuracy == pts[0].clean_accuracy == 1.0
    accs = [p.robust_accuracy for p in pts]
    assert all(a >= b for a, b in zip(accs, accs[1:], strict=False)) and accs[-1] < 0.5
    assert pts[-1].success_rate == pytest.approx(1 - accs[-1])
    out = robustness_curve_plot(tmp_path / "curve.png", {"pgd": pts})
    assert out.stat().st_size > 1000


def test_registry_errors_name_valid_choices(victim):
    assert set(ATTACK_NAMES) == {"fgsm", "bim", "ilcm", "pgd", "cw", "lbfgs", "jsma", "transfer"}
    with pytest.raises(ConfigError, match="valid choices: .*fgsm"):
        make_attack("deepfool", victim)
    with pytest.raises(ConfigError, match=r"valid: \['eps'"):
        make_attack("pgd", victim, epsilon=0.1)
    with pytest.raises(ConfigError, match="norm"):
        make_attack("pgd", victim, eps=0.1, norm="l1")


# -- comparable ε sweeps (issue 13 item 8) ---------------------------------------------------------------------
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


def test_sweep_compares_only_attacks_of_its_norm(victim, batch):
    x, y = batch
    x, y = x[:40], y[:40]
    # FGSM without a norm follows the sweep's: in an ℓ2 sweep it is the L2 fast-gradient method
    l2 = robust_accuracy(victim, x, y, "fgsm", [0.5], {}, norm="l2")[0]
    explicit = robust_accuracy(victim, x, y, "fgsm", [0.5], {"norm": "l2"})[0]
    linf = robust_accuracy(victim, x, y, "fgsm", [0.5], {})[0]
    assert l2.robust_accuracy == explicit.robust_accuracy != linf.robust_accuracy
    with pytest.raises(ConfigError, match="linf.*l2"):
        robust_accuracy(victim, x, y, "fgsm", [0.5], {"norm": "linf"}, norm="l2")
    with pytest.raises(ConfigError, match="attacks in linf"):
        robust_accuracy(victim, x, y, "bim", [0.5], {}, norm="l2")
    with pytest.raises(ConfigError, match="takes no ε"):
        robust_accuracy(victim, x, y, "jsma", [0.5], {})
    # C&W takes no ε: it runs once and a point is broken at ε when its perturbation is within the ℓ2 ball
    cw = robust_accuracy(victim, x, y, "cw", [0.0, 0.3, 1.0, 3.0], {"steps": 30, "binary_steps": 4, "lr": 0.05},
                         norm="l2")
    accs = [p.robust_accuracy for p in cw]
    assert accs == sorted(accs, reverse=True) and accs[1] > accs[-1]
    res = make_attack("cw", victim, steps=30, binary_steps=4, lr=0.05)(x, y)
    d = (res.x_adv - x).flatten(1).norm(dim=1)
    with attack_mode(victim):
        correct = predict(victim, x) == y
    assert accs[2] == pytest.approx(float((correct & ~(res.success & (d <= 1.0 + 1e-6))).float().mean()))


def test_pgd_l2_random_start_covers_the_ball(victim):
    from modelward.robustness.attacks.pgd import PGD

    x = torch.full((4000, 1, 8, 8), 0.5)
    g = torch.Generator().manual_seed(0)
    r = (PGD(victim, eps=0.4, norm="l2")._start(x, g) - x).flatten(1).norm(dim=1)
    assert float(r.max()) <= 0.4 + 1e-6
    assert abs(float(r.mean()) - 0.2) < 0.01 and float((r < 0.2).float().mean()) == pytest.approx(0.5, abs=0.03)
    rv = (PGD(victim, eps=0.4, norm="l2", start_radius="volume")._start(x, g) - x).flatten(1).norm(dim=1)
    assert float((rv > 0.38).float().mean()) > 0.9  # uniform in volume: almost always at the sphere in d = 64
