"""Label-only membership inference through a top-1 API: boundary distance (HopSkipJump) and augmentation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from modelward.core.data import load_data
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError, DataError
from modelward.privacy import metrics
from modelward.privacy.membership import make_membership_attack
from modelward.privacy.membership.base import AttackData
from modelward.privacy.membership.label_only import AugmentationAttack, BoundaryDistanceAttack, top1_api


class NoLogits(torch.nn.Module):
    """A target whose logits must never be read: the attacks may only use the API."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise AssertionError("a label-only attack read the model's logits")


@pytest.fixture(scope="module")
def overfit() -> dict:
    d = load_data()
    torch.manual_seed(0)
    x, y = torch.cat([d.x_train, d.x_test]), torch.cat([d.y_train, d.y_test])
    p = torch.randperm(len(x))
    part = {"xi": x[p[:150]], "yi": y[p[:150]], "xo": x[p[150:300]], "yo": y[p[150:300]],
            "xa": x[p[300:500]], "ya": y[p[300:500]]}
    m = build_model(ModelConfig(arch="mlp", hidden=[64]), d.input_shape, 10)
    opt = torch.optim.Adam(m.parameters(), 1e-2)
    for _ in range(200):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(part["xi"]), part["yi"]).backward()
        opt.step()
    return part | {"model": m.eval()}


@pytest.mark.parametrize("name", ["boundary", "augmentation"])
def test_label_only_attacks_find_members_through_labels_only(overfit: dict, name: str) -> None:
    o = overfit
    api = top1_api(o["model"])
    attack = make_membership_attack(name, api=api).fit(AttackData(NoLogits(), o["xa"], o["ya"], 10))
    scores = attack.score(torch.cat([o["xi"], o["xo"]]), torch.cat([o["yi"], o["yo"]]))
    members = np.r_[np.ones(150), np.zeros(150)].astype(bool)
    res = metrics.evaluate(scores, members, attack.threshold)
    assert res.auc > 0.56, res  # the overfit model (train 100 %, test ~90 %) leaks through its labels
    assert np.isfinite(res.epsilon_lb) and res.epsilon_lb >= 0
    assert attack.api.queries > 300  # every query went through the counted API
    # the hold-out threshold: about half of the non-members flagged (quantile 0.5)
    assert 0.3 < res.fpr < 0.7


def test_boundary_distance_is_the_distance_to_a_known_boundary() -> None:
    # linear classifier on 2-D points: class 1 iff x0 > 0; the distance of (a, b) with a > 0 is a
    lin = torch.nn.Linear(2, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[-1.0, 0.0], [1.0, 0.0]]))
        lin.bias.zero_()
    x_aux = torch.tensor([[-2.0, -2.0], [2.0, 2.0]])
    attack = BoundaryDistanceAttack(api=top1_api(lin), binary_steps=20).fit(
        AttackData(NoLogits(), x_aux, torch.tensor([0, 1]), 2))
    x = torch.tensor([[0.5, 0.3], [1.5, -1.0], [-0.7, 0.0]])
    d = attack.score(x, torch.tensor([1, 1, 1]))
    assert d[0] == pytest.approx(0.5, rel=0.05) and d[1] == pytest.approx(1.5, rel=0.05)
    assert d[2] == 0.0  # misclassified: at distance 0, guessed non-member


def test_augmentation_counts_agreeing_labels() -> None:
    lin = torch.nn.Linear(2, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[-1.0, 0.0], [1.0, 0.0]]))
        lin.bias.zero_()
    a = AugmentationAttack(api=top1_api(lin), samples=200, noise=1.0)
    a.fit(AttackData(NoLogits(), torch.tensor([[-3.0, 0.0], [3.0, 0.0]]), torch.tensor([0, 1]), 2))
    s = a.score(torch.tensor([[10.0, 0.0], [0.0, 0.0]]), torch.tensor([1, 1]))
    assert s[0] == 1.0 and 0.35 < s[1] < 0.65


def test_a_lying_api_is_refused_and_bad_parameters_named() -> None:
    with pytest.raises(DataError, match="answered 1 labels for 66 queries"):
        AugmentationAttack(api=lambda x: torch.zeros(1)).fit(
            AttackData(NoLogits(), torch.zeros(2, 2), torch.zeros(2, dtype=torch.long), 2))
    with pytest.raises(ConfigError, match="quantile"):
        BoundaryDistanceAttack(quantile=1.5)
    with pytest.raises(ConfigError, match="noise"):
        AugmentationAttack(noise=0)
    with pytest.raises(ConfigError, match="callable"):
        make_membership_attack("boundary", api="http://127.0.0.1:8080")
