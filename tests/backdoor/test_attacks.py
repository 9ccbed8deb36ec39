"""Attacks: which rows are poisoned, what happens to their labels, what stays untouched, and that a trained
model learns the backdoor."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from modelward.backdoor.attacks import ATTACKS, make_backdoor_attack
from modelward.backdoor.attacks.clean_label import CleanLabel
from modelward.backdoor.experiment import Trained, defender_split
from modelward.errors import ConfigError

X = torch.rand(200, 1, 8, 8)
Y = torch.arange(200) % 10


@pytest.mark.parametrize("name", ["badnets", "blend", "wanet"])
def test_dirty_label_attacks_relabel_exactly_their_rows(name: str) -> None:
    before = X.clone()
    ps = make_backdoor_attack(name, target=4, rate=0.1, seed=1).poison(X, Y)
    assert ps.n_poisoned == 20
    assert (Y[ps.poisoned] != 4).all()  # taken from the other classes
    assert (ps.y[ps.poisoned] == 4).all()
    assert torch.equal(ps.y[~ps.poisoned], Y[~ps.poisoned])  # nobody else is relabelled
    untouched = ~(ps.poisoned | ps.cover)
    assert torch.equal(ps.x[untouched], X[untouched])
    assert not torch.equal(ps.x[ps.poisoned], X[ps.poisoned])
    assert torch.equal(X, before)  # the caller's data is not modified in place


def test_wanet_cover_rows_keep_their_labels_and_the_choice_is_seeded() -> None:
    a = make_backdoor_attack("wanet", rate=0.05, cross_ratio=2.0, seed=0)
    ps = a.poison(X, Y)
    assert int(ps.cover.sum()) == 20 and not (ps.cover & ps.poisoned).any()
    assert torch.equal(ps.y[ps.cover], Y[ps.cover])
    assert torch.equal(ps.poisoned, make_backdoor_attack("wanet", rate=0.05, seed=0).poison(X, Y).poisoned)
    assert not torch.equal(ps.poisoned, make_backdoor_attack("wanet", rate=0.05, seed=1).poison(X, Y).poisoned)


def test_clean_label_poisons_only_target_rows_and_keeps_labels_within_eps() -> None:
    surrogate = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    atk = CleanLabel(target=2, rate=0.05, surrogate=surrogate, eps=0.1, steps=5, corners=False, size=2)
    ps = atk.poison(X, Y)
    assert ps.n_poisoned == 10 and (Y[ps.poisoned] == 2).all() and torch.equal(ps.y, Y)
    # outside the patch the change is the PGD perturbation, inside the ε ball
    delta = (ps.x[ps.poisoned] - X[ps.poisoned])[..., :6, :6]
    assert delta.abs().max() <= 0.1 + 1e-6 and delta.abs().max() > 0
    with pytest.raises(ConfigError, match="eligible"):
        CleanLabel(target=2, rate=0.5).poison(X, Y)


def test_bad_attack_settings_are_refused_with_the_choices() -> None:
    with pytest.raises(ConfigError, match="valid choices"):
        make_backdoor_attack("trojannn")
    with pytest.raises(ConfigError, match="valid"):
        make_backdoor_attack("badnets", sise=3)
    with pytest.raises(ConfigError, match="rate"):
        make_backdoor_attack("blend", rate=1.5)
    with pytest.raises(ConfigError, match="not a class"):
        make_backdoor_attack("badnets", target=12).poison(X, Y)
    assert ATTACKS.names() == ["badnets", "blend", "clean_label", "wanet"]


def test_the_trained_model_learns_the_backdoor(backdoored: Trained) -> None:
    eff = backdoored.effect
    assert eff is not None
    assert eff.attack_success_rate > 0.9  # BadNets 2×2 on 10 % of digits: the backdoor is learned
    assert eff.clean_accuracy > 0.9
    _, (xe, ye) = defender_split(backdoored.data, 0)
    assert eff.asr_n == int((ye != 3).sum()) and eff.clean_n == len(ye)
