"""Benchmark: the demo's completion study with early stopping vs without (same study, same machine, one run).

Early stopping ends a retraining run at the first evaluation where the highest-α threshold is met; since every
lower-α threshold is higher, the MC-hardness tables must be identical — the script checks that — and only wall
time changes.

    .venv/bin/python bench/completion_study.py [--workers N] [--seeds 3]
"""

from __future__ import annotations

import argparse
import csv
import os
import tempfile
import time
from pathlib import Path

from modelward.completion.study import run_study
from modelward.demo import demo_study_config


def _table(out: Path) -> list[dict[str, str]]:
    with (out / "hardness.csv").open() as f:
        return list(csv.DictReader(f))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    base = demo_study_config().model_copy(update={"seeds": list(range(args.seeds))})
    times = {}
    tables = {}
    with tempfile.TemporaryDirectory() as tmp:
        for early in (True, False):
            cfg = base.model_copy(update={"early_stop": early})
            out = Path(tmp) / f"early_{early}"
            t0 = time.perf_counter()
            outcome = run_study(cfg, out, workers=args.workers)
            times[early] = time.perf_counter() - t0
            tables[early] = _table(out)
            assert not outcome.failed, outcome.failed
    runs = outcome.total
    print(f"\ncompletion study '{base.name}': {runs} runs, {args.seeds} seeds, workers={args.workers}")
    print(f"  with early stopping    : {times[True]:8.1f} s")
    print(f"  without early stopping : {times[False]:8.1f} s")
    print(f"  speed-up               : {times[False] / times[True]:8.2f}x")
    print(f"  identical hardness tables: {tables[True] == tables[False]}")


if __name__ == "__main__":
    main()
