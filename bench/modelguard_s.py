"""ModelGuard-S lookup latency at 1k and 10k centroids (goal < 100 µs/query), vs a per-centroid Python loop.

    .venv/bin/python bench/modelguard_s.py [--classes 10] [--queries 300]

Worst case: every centroid has the queried top-1 class and the queries are not covered (a full scan per query).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from modelward.extraction.defenses import make_defense


def loop_lookup(cents: list[np.ndarray], y: np.ndarray, eps: float) -> np.ndarray:
    """Baseline: Algorithm 1's lookup written as a loop over the ordered centroid list."""
    for c in cents:
        if np.abs(c - y).sum() <= eps:
            return c
    return y


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--epsilon", type=float, default=0.05)
    args = ap.parse_args()
    k, eps = args.classes, args.epsilon
    print(f"{'centroids':>9} {'single µs/q':>12} {'batch-64 µs/q':>14} {'loop µs/q':>10} {'speed-up':>9}")
    for n in (1_000, 10_000):
        g = torch.Generator().manual_seed(n)
        logits = torch.randn(n + args.queries, k, generator=g, dtype=torch.float64) * 3
        logits[:, 0] += 20  # every centroid and query in class 0: the whole list is scanned
        ys = torch.softmax(logits, 1)
        ys[:, 1:] = torch.softmax(torch.randn(n + args.queries, k - 1, generator=g, dtype=torch.float64), 1) * 0.3
        ys[:, 0] = 0.7
        cents, queries = ys[:n], ys[n:]
        d = make_defense("modelguard_s", epsilon=eps)
        d.load_state_dict({"centroids": cents, "labels": torch.zeros(n, dtype=torch.int64),
                           "num_classes": torch.tensor([k])})
        t0 = time.perf_counter()
        for i in range(args.queries):
            d.defend_frozen(queries[i:i + 1])
        single = (time.perf_counter() - t0) / args.queries
        t0 = time.perf_counter()
        for i in range(0, args.queries, 64):
            d.defend_frozen(queries[i:i + 64])
        batch = (time.perf_counter() - t0) / args.queries
        cl = list(cents.numpy())
        m = max(20, args.queries // 10)
        t0 = time.perf_counter()
        for q in queries[:m].numpy():
            loop_lookup(cl, q, eps)
        loop = (time.perf_counter() - t0) / m
        print(f"{n:>9} {single * 1e6:>12.1f} {batch * 1e6:>14.1f} {loop * 1e6:>10.0f} {loop / single:>8.0f}x")


if __name__ == "__main__":
    main()
