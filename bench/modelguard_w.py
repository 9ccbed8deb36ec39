"""ModelGuard-W: the batched structural solver vs the scipy HiGHS LP reference on the same batch.

    .venv/bin/python bench/modelguard_w.py [--rows 300] [--classes 10 100]

Prints per-query time of both solvers, the speed-up, and the largest objective gap (must be < 1e-6).
"""

from __future__ import annotations

import argparse
import time

import torch

from modelward.extraction.defenses import make_defense
from modelward.extraction.defenses.modelguard_w import objective


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=300)
    ap.add_argument("--classes", type=int, nargs="+", default=[10, 100])
    ap.add_argument("--epsilon", type=float, default=1.0)
    args = ap.parse_args()
    print(f"{'K':>4} {'rows':>5} {'LP ms/query':>12} {'fast µs/query':>14} {'speed-up':>9} {'max |Δobj|':>11}")
    for k in args.classes:
        g = torch.Generator().manual_seed(k)
        # a mix of confident and unsure predictions (temperature-scaled logits)
        y = torch.softmax(torch.randn(args.rows, k, generator=g, dtype=torch.float64)
                          * torch.rand(args.rows, 1, generator=g, dtype=torch.float64) * 6, 1)
        lp, fast = (make_defense("modelguard_w", epsilon=args.epsilon, solver=s) for s in ("lp", "fast"))
        lp.defend(y[:2])  # warm-up: the first linprog call pays scipy's imports
        t0 = time.perf_counter()
        out_lp = lp.defend(y)
        t_lp = time.perf_counter() - t0
        fast.defend(y[:8])  # warm-up
        reps = 5
        t0 = time.perf_counter()
        for _ in range(reps):
            out_fast = fast.defend(y)
        t_fast = (time.perf_counter() - t0) / reps
        gap = float((objective(y, out_fast) - objective(y, out_lp)).abs().max())
        print(f"{k:>4} {args.rows:>5} {t_lp / args.rows * 1e3:>12.3f} {t_fast / args.rows * 1e6:>14.1f} "
              f"{t_lp / t_fast:>8.0f}x {gap:>11.1e}")
        assert gap < 1e-6, "fast solver disagrees with the LP"


if __name__ == "__main__":
    main()
