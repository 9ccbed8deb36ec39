"""Shadow-model training throughput: 64 small MLPs trained together (stacked, exact) vs one after another.

Each model: digits-sized MLP 64 → 32 → 10, SGD (lr 0.05, momentum 0.9), batch 32, ``--steps`` steps on its own
random half of the digits data (LiRA's paired design). Both sides start from the same initialisations and see the
same batches; the script also prints the largest parameter difference between the two results (exactness).
Run: ``OMP_NUM_THREADS=1 python bench/shadow_training.py [--models 64] [--steps 100] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import copy
import os

import numpy as np
import torch
from _timing import median_time

from modelward.core.data import DataConfig, load_data
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig, build_model
from modelward.privacy.shadows import ModelTrainer, train_loop, train_stacked


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", type=int, default=64)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    d = load_data(DataConfig(source="digits"))
    x, y = torch.cat([d.x_train, d.x_test]), torch.cat([d.y_train, d.y_test])
    cfg = TrainConfig(lr=0.05, momentum=0.9, batch_size=32, steps=a.steps)
    trainer = ModelTrainer(lambda: build_model(ModelConfig(arch="mlp", hidden=[a.hidden]), (1, 8, 8), 10), cfg)
    rng = np.random.default_rng(0)
    sets = [rng.permutation(len(x))[: len(x) // 2] for _ in range(a.models)]
    seeds = list(range(a.models))
    init = [trainer.build(s) for s in seeds]
    stacked = median_time(lambda: train_stacked(copy.deepcopy(init), x, y, sets, cfg, seeds), a.repeats)
    loop = median_time(lambda: train_loop(copy.deepcopy(init), x, y, sets, cfg, seeds), a.repeats)
    ms = train_stacked(copy.deepcopy(init), x, y, sets, cfg, seeds)
    ml = train_loop(copy.deepcopy(init), x, y, sets, cfg, seeds)
    diff = max((p - q).abs().max().item() for m1, m2 in zip(ms, ml, strict=True)
               for p, q in zip(m1.parameters(), m2.parameters(), strict=True))
    print(f"{a.models} MLPs 64-{a.hidden}-10, {a.steps} steps, batch 32, threads {torch.get_num_threads()}")
    print(f"loop     {loop:.3f} s  ({a.models * a.steps / loop:,.0f} model-steps/s)")
    print(f"stacked  {stacked:.3f} s  ({a.models * a.steps / stacked:,.0f} model-steps/s)")
    print(f"speed-up {loop / stacked:.1f}x  (goal >= 5x); max |Δθ| stacked vs loop = {diff:.2e}")


if __name__ == "__main__":
    main()
