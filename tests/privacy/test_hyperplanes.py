"""Black-box hyperplane recovery (seed 002 §8.6.2): the first layer of a ReLU net read back from queries alone."""

from __future__ import annotations

import numpy as np
import torch

from modelward.privacy.hyperplanes import HyperplaneRecovery, match_columns


def _net(*sizes: int, seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(torch.nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).double()


def test_one_hidden_layer_every_boundary_is_a_first_layer_column() -> None:
    net = _net(5, 7, 3)
    rec = HyperplaneRecovery(net, input_dim=5, box=(-3.0, 3.0), seed=1)
    found = rec.recover(lines=60)
    w = net[0].weight.detach().numpy()
    w = w / np.linalg.norm(w, axis=1, keepdims=True)
    cos = np.abs(np.stack([h.normal for h in found]) @ w.T).max(1)
    assert len(found) >= 7 and cos.min() > 0.999  # every recovered normal is some unit's column, exactly
    assert (match_columns(found, net[0].weight) > 0.999).sum() >= 6  # nearly every unit is recovered
    assert rec.queries == sum(h.queries for h in found) + (rec.queries - sum(h.queries for h in found))
    assert all(h.queries == 2 * (5 + 1) for h in found)  # two one-sided gradients per hyperplane


def test_deeper_nets_still_give_exact_first_layer_columns() -> None:
    net = _net(8, 12, 12, 4, seed=2)
    rec = HyperplaneRecovery(net, input_dim=8, seed=2)
    m = match_columns(rec.recover(lines=80), net[0].weight)
    got = m > 0.99
    assert got.sum() >= 4 and m[got].mean() > 0.999


def test_a_linear_model_has_no_boundary() -> None:
    lin = torch.nn.Linear(4, 3).double()
    rec = HyperplaneRecovery(lin, input_dim=4, seed=0)
    assert rec.recover(lines=10) == [] and rec.queries > 0
