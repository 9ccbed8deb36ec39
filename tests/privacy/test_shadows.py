"""Stacked (batched) shadow training is exactly K separate trainings; the LiRA pool design."""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig, build_model
from modelward.privacy.shadows import ModelTrainer, ShadowPool, train_loop, train_stacked


def _max_diff(a: list[nn.Module], b: list[nn.Module]) -> float:
    return max((p - q).abs().max().item() for m1, m2 in zip(a, b, strict=True)
               for p, q in zip(m1.parameters(), m2.parameters(), strict=True))


def test_stacked_mlp_training_equals_the_loop() -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(100, 1, 4, 4, generator=g), torch.randint(0, 3, (100,), generator=g)
    t = ModelTrainer(lambda: build_model(ModelConfig(arch="mlp", hidden=[8, 8]), (1, 4, 4), 3),
                     TrainConfig(lr=0.1, momentum=0.9, weight_decay=1e-3, batch_size=16, steps=30))
    sets = [np.random.default_rng(k).choice(100, 50 + 5 * k, replace=False) for k in range(4)]
    models = [t.build(k) for k in range(4)]
    ref = train_loop(copy.deepcopy(models), x, y, sets, t.cfg, [0, 1, 2, 3])
    out = train_stacked(models, x, y, sets, t.cfg, [0, 1, 2, 3])
    assert _max_diff(out, ref) < 1e-5
    assert _max_diff(out, [t.build(k) for k in range(4)]) > 1e-2  # they did train


def test_stacked_generic_module_via_vmap_equals_the_loop() -> None:
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(60, 3, generator=g), torch.randint(0, 2, (60,), generator=g)
    t = ModelTrainer(lambda: nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)),
                     TrainConfig(optimizer="adam", lr=1e-2, batch_size=10, steps=20))
    sets = [np.arange(0, 30), np.arange(30, 60)]
    models = [t.build(k) for k in range(2)]
    ref = train_loop(copy.deepcopy(models), x, y, sets, t.cfg, [5, 6])
    assert _max_diff(train_stacked(models, x, y, sets, t.cfg, [5, 6]), ref) < 1e-5


def test_pool_puts_each_point_in_half_the_models_and_round_trips(tmp_path) -> None:
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(40, 3, generator=g), torch.randint(0, 2, (40,), generator=g)
    t = ModelTrainer(lambda: build_model(ModelConfig(arch="mlp", hidden=[4]), (3,), 2),
                     TrainConfig(lr=0.1, batch_size=8, steps=5))
    pool = ShadowPool.train(t, x, y, count=6, seed=0)
    assert (pool.masks.sum(0) == 3).all() and (pool.masks.sum(1) == 20).all()
    pool.save(tmp_path / "p.safetensors")
    back = ShadowPool.load(tmp_path / "p.safetensors", t.factory)
    assert np.array_equal(back.masks, pool.masks)
    assert torch.equal(back.models[3](x), pool.models[3](x))
    assert pool.lookup(torch.cat([x[[5, 7]], torch.full((1, 3), 9.0)])).tolist() == [5, 7, -1]
