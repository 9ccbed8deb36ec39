"""LocalVictim: softmax → defense, query counting, budgets and distortion bookkeeping."""

from __future__ import annotations

import pytest
import torch

from modelward.core.zoo import ModelConfig, build_model
from modelward.extraction.defenses import make_defense
from modelward.extraction.victim import LocalVictim, QueryBudgetExceeded, Victim


def test_local_victim_applies_the_defense_and_counts():
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="mlp", hidden=[8]), (1, 3, 3), 4)
    x = torch.rand(10, 1, 3, 3)
    plain = LocalVictim(model, batch_size=3)
    clean = plain.clean(x)
    assert isinstance(plain, Victim) and plain.queries_used == 0 and plain.num_classes == 4
    assert torch.allclose(plain.query(x), clean) and plain.queries_used == 10 and plain.max_l1 < 1e-6
    top = LocalVictim(model, make_defense("top1"), batch_size=4, query_budget=15)
    out = top.query(x)
    assert torch.equal(out.argmax(1), clean.argmax(1)) and torch.equal(out.max(1).values, torch.ones(10))
    assert abs(top.max_l1 - float(2 * (1 - clean.max(1).values).max())) < 1e-5
    assert 0 < top.mean_l1 <= top.max_l1
    with pytest.raises(QueryBudgetExceeded):
        top.query(x)
    assert top.queries_used == 10
    top.query(x[:5])
    assert top.queries_used == 15
    # input-dependent defenses receive the queried inputs
    mad = LocalVictim(model, make_defense("mad", epsilon=0.3, surrogate=model), batch_size=4)
    assert mad.query(x).shape == (10, 4) and 0.29 < mad.max_l1 <= 0.3 + 1e-5
