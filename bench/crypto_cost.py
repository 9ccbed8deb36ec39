"""The cost of the cryptographic alternatives at a fixed small size (issue 16; seed 000 §1's claims).

Same measurement as ``modelward cost``: an x²-activation MLP (30 → 8 → 2) on breast_cancer, trained in plaintext,
then 8 test samples through plain PyTorch, the split governance path (2 party processes, gRPC + mutual TLS),
TenSEAL CKKS (128-bit parameters) and MPyC (3 party processes), every output checked against plain. Prints the
table and the ratios next to the seed's claims (HE > 1000×, MPC > 24× and > 16 bytes per multiplication).

    OMP_NUM_THREADS=1 .venv/bin/python bench/crypto_cost.py [--samples 8] [--hidden 8] [--backends plain,split,he,mpc]
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from pathlib import Path

from modelward.core.data import DataConfig
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig
from modelward.cost.report import claims
from modelward.cost.run import CostConfig, CostSettings, run_cost, table_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=8)
    ap.add_argument("--backends", default="plain,split,he,mpc,crypten")
    args = ap.parse_args()
    cfg = CostConfig(
        data=DataConfig(source="breast_cancer", test_fraction=0.25, seed=0),
        model=ModelConfig(arch="entrypoint", entrypoint="modelward.cost.models:square_mlp",
                          kwargs={"hidden": [args.hidden]}),
        train=TrainConfig(optimizer="adam", lr=0.01, steps=200, batch_size=32, eval_every=100),
        cost=CostSettings.model_validate({"backends": args.backends.split(","), "samples": args.samples,
                                          "repeats": 5, "train_steps": 3, "train_batch": 16,
                                          "he": {}}),
    )
    t0 = time.perf_counter()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        results, info = run_cost(cfg, Path(tmp), log=print)
    rows = table_rows(results, info)
    print(f"\nbreast_cancer, MLP 30-{args.hidden}-2 with x², {info['samples']} samples, "
          f"{info['multiplications']} multiplications/sample, load average {load:.1f}, {time.perf_counter() - t0:.0f}s")
    print(f"{'backend':8s} {'status':11s} {'ms/sample':>10s} {'ms/batch':>10s} {'×plain':>9s} {'B/sample':>10s} "
          f"{'B/mult':>7s} {'max|Δ|':>8s} {'train ×plain':>12s}")
    for r in rows:
        def f(v: float, fmt: str) -> str:
            return format(v, fmt) if isinstance(v, float) and math.isfinite(v) else "–"
        print(f"{r['backend']:8s} {r['status']:11s} {f(r['latency_sample_ms'], '10.3g')} "
              f"{f(r['latency_batch_ms'], '10.3g')} {f(r['slowdown_sample'], '9.3g')} "
              f"{f(r['bytes_per_sample'], '10.3g')} {f(r['bytes_per_mult'], '7.3g')} {f(r['max_abs_diff'], '8.2g')} "
              f"{f(r['train_slowdown'], '12.3g')}")
    for c in claims(rows):
        verdict = "not measured" if c["holds"] is None else ("holds" if c["holds"] else "does NOT hold")
        print(f"seed claim {c['claim']}: measured {c['measured']:.3g} -> {verdict}")


if __name__ == "__main__":
    main()
