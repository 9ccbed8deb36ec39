"""Issue 38 item 4: AutoAttack on 2- and 3-class models, and a quick profile never weaker than one reference
APGD-CE run.

Before the fix a binary model's AutoAttack stopped at "targeted DLR loss needs at least 4 classes" (binary tabular
models, the commonest CSV case, got PGD only), and the assess quick profile ran APGD-CE for 20 iterations on the
first 50 of its 200 points, so its L∞ figure could stay above torchattacks' 100-iteration APGD-CE on the same points.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from modelward.assess.profiles import PROFILES
from modelward.assess.sections.common import SectionResult
from modelward.assess.sections.robustness import _sandwich, sandwich_params
from modelward.robustness.attacks import APGD, AutoAttack
from modelward.robustness.attacks.autoattack import FEW_CLASSES

torch.set_num_threads(1)


def _tabular(num_classes: int) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=400, n_features=8, n_informative=5, n_classes=num_classes,
                               n_clusters_per_class=1, random_state=0)
    x, y = torch.tensor(x, dtype=torch.float32), torch.tensor(y)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, num_classes))
    opt = torch.optim.Adam(m.parameters(), 1e-2)
    for _ in range(150):
        opt.zero_grad()
        F.cross_entropy(m(x[:300]), y[:300]).backward()
        opt.step()
    return m.eval(), x[300:340], y[300:340]


@pytest.mark.parametrize("num_classes", [2, 3])
def test_autoattack_runs_its_few_class_variant(num_classes: int) -> None:
    model, x, y = _tabular(num_classes)
    res = AutoAttack(model, eps=0.5, norm="linf", steps=10, n_queries=50, clip=(-6.0, 6.0))(x, y)
    assert res.members == FEW_CLASSES[num_classes]
    assert set(res.counts()) == {"clean", *FEW_CLASSES[num_classes]}
    alone = APGD(model, eps=0.5, steps=10, clip=(-6.0, 6.0))(x, y)
    assert res.success_rate >= alone.success_rate > 0.0  # APGD-CE first with the same seed, the others add


def test_the_assess_sandwich_of_a_binary_tabular_model_is_autoattack(tmp_path: Path) -> None:
    model, x, y = _tabular(2)
    res = SectionResult("robustness", "Robustness")
    # the data's own box: CROWN then certifies the ball the attacks search (with the [0, 1] default it certified
    # ball ∩ [0, 1] for data outside it, and APGD-CE "broke" certified points by leaving the ball: SoundnessError)
    _sandwich(res, tmp_path, model, x[:20], y[:20], 0.3, 0.9, PROFILES["quick"], "test units", 0, (-6.0, 6.0))
    keys = {m["key"] for m in res.metrics}
    assert {"autoattack_linf@0.3", "autoattack_l2@0.9"} <= keys, res.notes
    assert "fewer than 4 classes" in res.tables[0]["notes"][0]


@pytest.mark.slow
def test_quick_profile_contains_one_reference_apgd_ce_run_on_a_small_rgb_resnet() -> None:
    """Every point torchattacks' APGD-CE (100 iterations, the reference's) breaks is broken by the quick profile's
    AutoAttack, by its APGD-CE member at the very same iterate (same algorithm, seed and batch)."""
    torchattacks = pytest.importorskip("torchattacks", reason="torchattacks is the reference (modelward[bench])")
    from modelward.core.data import DataConfig, load_data
    from modelward.core.zoo import ModelConfig, build_model
    from modelward.robustness.attacks.base import predict

    d = load_data(DataConfig(source="synthetic_images", channels=3, image_size=8, n_samples=400, num_classes=10,
                             noise=0.6))
    model = build_model(ModelConfig(arch="resnet", sections=[1], base_channels=4), (3, 8, 8), 10)
    torch.manual_seed(1)
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    for _ in range(80):
        idx = torch.randint(len(d.x_train), (64,))
        opt.zero_grad()
        F.cross_entropy(model(d.x_train[idx]), d.y_train[idx]).backward()
        opt.step()
    model.eval()
    x, y, eps = d.x_test[:16], d.y_test[:16], 16 / 255
    params = sandwich_params(PROFILES["quick"])
    assert params["ce_steps"] == 100
    ours = AutoAttack(model, eps=eps, norm="linf", seed=0, **params)(x, y)
    ref = torchattacks.APGD(model, norm="Linf", eps=eps, steps=100, n_restarts=1, loss="ce", seed=0)(x, y)
    broken_ref = predict(model, ref) != y
    assert 0 < int(broken_ref.sum()) < len(y)
    assert bool((ours.success | ~broken_ref).all())  # never weaker than the reference APGD-CE run
    by_ce = torch.tensor([b == "apgd-ce" for b in ours.broken_by])
    assert torch.equal(by_ce, broken_ref & (predict(model, x) == y))  # its APGD-CE member is the reference run


def test_quick_profile_breaks_what_the_reference_apgd_ce_breaks_on_digits(victim, digits_xy) -> None:
    """All 397 held-out digits, ℓ2 ε = 0.5: the reference's 100-iteration APGD-CE breaks a point (index 282 here)
    that the former quick setting (every member at 20 iterations, Square at 200 queries) left unbroken."""
    torchattacks = pytest.importorskip("torchattacks", reason="torchattacks is the reference (modelward[bench])")
    from modelward.robustness.attacks.base import predict

    x, y = digits_xy[0][1400:], digits_xy[1][1400:]
    victim.eval()
    ours = AutoAttack(victim, eps=0.5, norm="l2", seed=0, **sandwich_params(PROFILES["quick"]))(x, y)
    ref = torchattacks.APGD(victim, norm="L2", eps=0.5, steps=100, n_restarts=1, loss="ce", seed=0)(x, y)
    missed = (predict(victim, ref) != y) & ~ours.success
    assert not bool(missed.any()), missed.nonzero().flatten().tolist()
