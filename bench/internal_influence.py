"""Internal influence (seed 002 Def. 3.2) with a 64-step straight-line path on a batch of 256 inputs: modelward vs
Captum's ``InternalInfluence`` on the same model, layer, target and quadrature, in one run (goal: ratio ≥ 1.0×).

Run: ``python bench/internal_influence.py`` (needs captum: ``pip install captum``, which leaves torch as it is).
Both sides process all 64 × 256 path points in one batch; the results are checked to agree before timing.
"""

from __future__ import annotations

import os
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

    def run_captum() -> torch.Tensor:
        return theirs.attribute(x, target=target, n_steps=STEPS, method="gausslegendre")

    diff = (run_ours() - run_captum()).abs().max().item()
    t_ours = median_time(run_ours, REPEATS)
    t_captum = median_time(run_captum, REPEATS)
    print(f"internal influence, SmallCNN(32,64,128) on 1×8×8, slice {layer}, {STEPS}-step Gauss–Legendre path, "
          f"batch {BATCH} ({STEPS * BATCH} path points), torch threads {torch.get_num_threads()}")
    print(f"max |ours − captum| = {diff:.2e} (float32)")
    print(f"modelward {t_ours * 1e3:.1f} ms · captum {t_captum * 1e3:.1f} ms · speed-up {t_captum / t_ours:.2f}× "
          f"(median of {REPEATS})")


if __name__ == "__main__":
    main()
