"""Mitigation: unlearning the reversed trigger removes the backdoor at a small clean-accuracy cost; fine-pruning
prunes for real and keeps the architecture."""

from __future__ import annotations

import torch

from modelward.backdoor.attacks.badnets import BadNets
from modelward.backdoor.detect.model.neural_cleanse import NeuralCleanse
from modelward.backdoor.experiment import Trained, defender_split
from modelward.backdoor.features import channel_activity, last_feature_map
from modelward.backdoor.mitigate.fine_pruning import effect_of, fine_prune
from modelward.backdoor.mitigate.unlearning import unlearn
from modelward.core.train import TrainConfig

from .conftest import TARGET


def test_unlearning_the_reversed_trigger_removes_the_backdoor(backdoored: Trained) -> None:
    (xd, yd), (xe, ye) = defender_split(backdoored.data, 0)
    nc = NeuralCleanse(epochs=30)
    v = nc.detect(backdoored.model, xd[:100], 10)
    measure = effect_of(BadNets(target=TARGET, size=2).apply, xe, ye, TARGET)  # the true trigger, unseen by the defender
    before = {k: t.clone() for k, t in backdoored.model.state_dict().items()}
    rep = unlearn(backdoored.model, nc.last.trigger(v.suspect_class), xd, yd, xe, ye,
                  finetune=TrainConfig(steps=150, lr=0.01, eval_every=150), effect=measure)
    assert rep.before["attack_success_rate"] > 0.9
    assert rep.after["attack_success_rate"] < 0.2
    assert rep.after["clean_accuracy"] > rep.before["clean_accuracy"] - 0.05
    assert all(torch.equal(before[k], t) for k, t in backdoored.model.state_dict().items())  # a copy was repaired


def test_fine_pruning_zeroes_the_pruned_channels_in_the_saved_weights(backdoored: Trained) -> None:
    (xd, yd), (xe, ye) = defender_split(backdoored.data, 0)
    rep = fine_prune(backdoored.model, xd, yd, xe, ye, max_drop=0.1,
                     finetune=TrainConfig(steps=50, lr=0.01, eval_every=50))
    layer = rep.details["layer"]
    assert layer == last_feature_map(backdoored.model, xd) == "conv2"
    assert rep.details["pruned"] and rep.after["clean_accuracy"] > rep.before["clean_accuracy"] - 0.1
    act = channel_activity(rep.model, layer, xe)  # the repaired model alone, no hook: pruned channels are dead
    assert act[rep.details["pruned"]].abs().max() == 0
    assert set(rep.model.state_dict()) == set(backdoored.model.state_dict())  # the original architecture
