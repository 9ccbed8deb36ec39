"""Issue 39's text report: a classifier over token ids in an .npz was z-scored ("near chance, no verdict") or, with
standardize = false, failed deep in autograd. Now the mismatch is named before any section, and `tokens = true`
keeps the ids as they are (int64, never standardised) for the model's embedding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from modelward.assess.config import AssessConfig
from modelward.assess.target import load_target, quality_warning
from modelward.core.entrypoints import TRUST_ENV
from modelward.errors import ConfigError

NETS = '''
import torch
from torch import nn

class Bag(nn.Module):
    def __init__(self, vocab=20, num_classes=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, 8)
        self.out = nn.Linear(8, num_classes)

    def forward(self, ids):
        return self.out(self.emb(ids).mean(1))

def bag(num_classes):
    torch.manual_seed(0)
    return Bag(num_classes=num_classes)
'''


def test_token_ids_reach_an_embedding_model_as_ids(tmp_path, monkeypatch):
    (tmp_path / "textnets.py").write_text(NETS)
    monkeypatch.setenv(TRUST_ENV, "1")  # the operator trusts this config's entry point
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 200)
    x = rng.integers(3, 20, (200, 6))
    x[:, 0] = 1 + y  # the first token says the class
    np.savez(tmp_path / "train.npz", x=x[:150], y=y[:150])
    np.savez(tmp_path / "test.npz", x=x[150:], y=y[150:])
    base = {"model": {"arch": "entrypoint", "entrypoint": "textnets:bag"},
            "data": {"source": "npz", "path": "train.npz", "test_path": "test.npz"}}
    cfg = AssessConfig.model_validate(base).resolve_paths(tmp_path)
    with pytest.raises(ConfigError, match="starts with an nn.Embedding.*data.tokens = true"):
        load_target(cfg)
    base["data"]["tokens"] = True
    target = load_target(AssessConfig.model_validate(base).resolve_paths(tmp_path))
    assert target.data.x_train.dtype == torch.int64 and torch.equal(target.data.x_test[:, 0],
                                                                    torch.as_tensor(x[150:, 0]))
    opt = torch.optim.Adam(target.model.parameters(), lr=0.1)
    target.model.train()
    for _ in range(60):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(target.model(target.data.x_train), target.data.y_train).backward()
        opt.step()
    target.model.eval()
    acc, warning = quality_warning(target)
    assert acc > 0.9 and warning is None  # learned from the ids: a verdict is given
