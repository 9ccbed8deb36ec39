"""The split backward pass (input gradient first, weight gradients later) against one backward() call."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from modelward.core.zoo import ModelConfig, build_model
from modelward.governance.party.backward import input_gradient
from modelward.governance.plan import model_layers, segment_of


class TiedResidual(nn.Module):
    """A layer used twice, a residual connection, a parameter on two paths and one that is never used."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 3)
        self.scale = nn.Parameter(torch.randn(8))
        self.unused = nn.Parameter(torch.randn(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x)) + x
        return self.b(self.a(h) * self.scale) + (self.scale ** 2).sum()


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn, self.out = nn.LSTM(4, 6, batch_first=True), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.rnn(x)[0][:, -1])


def _segment(arch: str, **kw) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    full = build_model(ModelConfig(arch=arch, **kw), (1, 8, 8) if arch == "cnn" else (20,), 3)
    names = [lay.name for lay in model_layers(full)]
    first, rest = segment_of(full, names[:1], "a"), segment_of(full, names[1:], "b")
    with torch.no_grad():
        h = first(torch.randn(6, *((1, 8, 8) if arch == "cnn" else (20,))))
    return rest, h


CASES = {
    "tied-residual": lambda: (TiedResidual(), torch.randn(5, 8)),
    "lstm": lambda: (Recurrent(), torch.randn(3, 5, 4)),
    "cnn-batchnorm": lambda: _segment("cnn", channels=[8, 16], fc=32),
    "cnn-channels-last": lambda: (lambda m, h: (m, h.contiguous(memory_format=torch.channels_last)))(
        *_segment("cnn", channels=[8, 16], fc=32)),
    "mlp": lambda: _segment("mlp", hidden=[32, 16]),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("root_kind", ["loss", "output"])
def test_split_backward_is_bit_identical_to_backward(case, root_kind):
    torch.manual_seed(1)
    model, x = CASES[case]()
    ref, split = copy.deepcopy(model), copy.deepcopy(model)
    y = torch.randint(0, 3, (len(x),))
    g_out = torch.randn(len(x), 3)
    x_ref, x_split = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out_ref = ref(x_ref)
    if root_kind == "loss":
        F.cross_entropy(out_ref, y).backward()
    else:
        out_ref.backward(g_out)
    out = split(x_split)
    root, root_grad = (F.cross_entropy(out, y), None) if root_kind == "loss" else (out, g_out)
    params = list(split.parameters())
    (gx,), weights = input_gradient(root, [x_split], params, root_grad)
    assert all(p.grad is None for p in params)  # nothing but the input gradient so far
    assert torch.equal(gx, x_ref.grad)
    weights.run()
    for (name, p), q in zip(ref.named_parameters(), params, strict=True):
        if p.grad is None:
            assert q.grad is None, name
        else:
            assert torch.equal(p.grad, q.grad), name


def test_weight_gradients_accumulate_like_backward():
    lin = nn.Linear(3, 2)
    x = torch.randn(4, 3, requires_grad=True)
    lin(x).sum().backward()
    first = lin.weight.grad.clone()
    x2 = x.detach().requires_grad_(True)
    (_,), weights = input_gradient(lin(x2).sum(), [x2], list(lin.parameters()))
    weights.run()
    assert torch.equal(lin.weight.grad, 2 * first)
