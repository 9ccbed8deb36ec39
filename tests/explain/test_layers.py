"""Issue 38 item 5: the layer an explanation describes follows the data flow into the classifier.

Before the fix the "penultimate layer" of the zoo's ResNet was the module registered before the last nn.Linear:
``layer2.0.shortcut.1``, the BatchNorm of the last block's shortcut branch (one of two summands of the block's
output). Now it is the pooled features the classifier reads (``gap``), and the influence of its units on a class is
exactly the classifier's weights for that class — what an explanation of "the features the classifier reads" must
give.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from modelward.core.zoo import ModelConfig, build_model
from modelward.explain.interpret import top_units
from modelward.explain.layers import feature_layer


def _check_reads_classifier(model: nn.Module, layer: str, fc: nn.Linear, x: torch.Tensor) -> None:
    for c in range(fc.weight.shape[0]):
        top = top_units(model, layer, x, target=c, k=3)
        assert [u.unit for u in top] == torch.topk(fc.weight[c].detach(), 3).indices.tolist()
        assert top[0].score == pytest.approx(float(fc.weight[c].detach().max()), rel=1e-4)


def test_zoo_resnet_explains_the_pooled_features_its_classifier_reads() -> None:
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="resnet", sections=[1, 1], base_channels=4), (3, 8, 8), 4).eval()
    x = torch.rand(6, 3, 8, 8)
    layer = feature_layer(model, x)
    assert layer == "gap"
    _check_reads_classifier(model, layer, model.fc, x)


class _TwoBranch(nn.Module):
    """Branches summed and pooled in forward: no module outputs what the classifier reads."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 5, 3), nn.Conv2d(3, 5, 1, padding=0)
        self.head = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.a(x) + self.b(x)[:, :, 1:-1, 1:-1]).mean((2, 3)))


def test_a_branching_net_without_a_feature_module_is_cut_at_the_classifier_input() -> None:
    torch.manual_seed(0)
    model = _TwoBranch().eval()
    x = torch.rand(4, 3, 8, 8)
    assert feature_layer(model, x) == "head:in"
    _check_reads_classifier(model, "head:in", model.head, x)


def test_chains_keep_their_named_hidden_layer() -> None:
    assert feature_layer(build_model(ModelConfig(arch="cnn"), (1, 8, 8), 10), torch.rand(2, 1, 8, 8)) == "fc1"
    seq = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Dropout(0.1), nn.Linear(8, 2))
    assert feature_layer(seq, torch.rand(2, 1, 4, 4)) == "1"
