"""Internal influence (seed 002 Def. 3.2) with a 64-step straight-line path on a batch of 256 inputs: modelward vs
Captum's ``InternalInfluence`` on the same model, layer, target and quadrature, in one run (goal: ratio ≥ 1.0×).

Run: ``python bench/internal_influence.py`` (needs captum: ``pip install captum``, which leaves torch as it is).
Captum processes all 64 × 256 path points in one batch (its default); modelward in its default chunks of 4096
rows, running the part of the network below the slice without autograd book-keeping. The results are checked to
agree before timing; the two are timed alternately (median of 5 each).
"""

from __future__ import annotations

import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _timing import median_time  # noqa: E402

from modelward.core.zoo import SmallCNN  # noqa: E402
from modelward.explain.influence import ClassQoI, InternalInfluence, LinearDoI  # noqa: E402

STEPS, BATCH, REPEATS = 64, 256, 5


def main() -> None:
    try:
        from captum.attr import InternalInfluence as CaptumInternalInfluence
    except ImportError:
        print("captum is not installed (pip install captum); nothing to compare against")
        return
    torch.manual_seed(0)
    model = SmallCNN((1, 8, 8), [32, 64], 128, 10, bn=True).eval()
    x = torch.rand(BATCH, 1, 8, 8)
    target = torch.randint(0, 10, (BATCH,))
    layer = "conv2"
    ours = InternalInfluence(model, layer, ClassQoI(tuple(target.tolist())), LinearDoI(steps=STEPS))
    theirs = CaptumInternalInfluence(model, dict(model.named_modules())[layer])

    def run_ours() -> torch.Tensor:
        return ours.influence(x)

    one_batch = InternalInfluence(model, layer, ClassQoI(tuple(target.tolist())), LinearDoI(steps=STEPS),
                                  batch_size=None)

    def run_ours_one_batch() -> torch.Tensor:
        return one_batch.influence(x)

    def run_captum() -> torch.Tensor:
        return theirs.attribute(x, target=target, n_steps=STEPS, method="gausslegendre")

    diff = (run_ours() - run_captum()).abs().max().item()
    # alternate the two so that load from other processes hits both alike; median of each
    t_ours_l, t_one_l, t_captum_l = [], [], []
    for _ in range(REPEATS):
        t_ours_l.append(median_time(run_ours, 1))
        t_one_l.append(median_time(run_ours_one_batch, 1))
        t_captum_l.append(median_time(run_captum, 1))
    t_ours, t_one = statistics.median(t_ours_l), statistics.median(t_one_l)
    t_captum = statistics.median(t_captum_l)
    print(f"internal influence, SmallCNN(32,64,128) on 1×8×8, slice {layer}, {STEPS}-step Gauss–Legendre path, "
          f"batch {BATCH} ({STEPS * BATCH} path points), torch threads {torch.get_num_threads()}")
    print(f"max |ours − captum| = {diff:.2e} (float32)")
    print(f"modelward {t_ours * 1e3:.1f} ms · captum {t_captum * 1e3:.1f} ms · speed-up {t_captum / t_ours:.2f}× "
          f"(median of {REPEATS})")
    print(f"modelward in one batch of {STEPS * BATCH} rows (as captum): {t_one * 1e3:.1f} ms · speed-up "
          f"{t_captum / t_one:.2f}×")


if __name__ == "__main__":
    main()
