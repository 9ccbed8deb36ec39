"""Benchmark: the demo's completion study on 2 local Ray workers vs the local process pool (same study, one run).

    .venv/bin/python bench/study_executors.py [--workers 2] [--seeds 3] [--parts conv1,fc1]

Both executors run the same plan through the same runner and must give identical tables (checked). Reported:
wall time of each, the Ray time with and without starting the private Ray instance, and the throughput ratio
pool / Ray (goal ≥ 0.9×: Ray costs at most 10 %). Needs `pip install 'modelward[cluster]'`.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # keep the private Ray instance on 127.0.0.1

from modelward.completion.study import run_study  # noqa: E402
from modelward.demo import demo_study_config  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--parts", default="", help="comma-separated parts (default: the demo's five)")
    args = ap.parse_args()
    try:
        import ray
    except ImportError:
        print("ray is not installed: pip install 'modelward[cluster]'")
        return
    update: dict = {"seeds": list(range(args.seeds))}
    if args.parts:
        update["parts"] = args.parts.split(",")
    base = demo_study_config()
    if getattr(base, "reference_seeds", None) is not None:  # the T0 reference runs on a subset of the seeds
        update["reference_seeds"] = [s for s in base.reference_seeds if s in update["seeds"]] or update["seeds"][:1]
    cfg = type(base).model_validate({**base.model_dump(), **update})
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        pool = run_study(cfg, Path(tmp) / "pool", workers=args.workers, executor="process")
        t_pool = time.perf_counter() - t0

        from modelward.core.ray_executor import RayExecutor

        t0 = time.perf_counter()
        ex = RayExecutor(workers=args.workers)
        t_start = time.perf_counter() - t0
        t1 = time.perf_counter()
        rayed = run_study(cfg, Path(tmp) / "ray", workers=args.workers, executor=ex)
        t_runs = time.perf_counter() - t1
        ray.shutdown()
        same = (Path(tmp) / "pool" / "hardness.csv").read_text() == (Path(tmp) / "ray" / "hardness.csv").read_text()
    n = pool.total
    print(f"demo study: {n} runs ({args.seeds} seed(s), parts {cfg.parts}), {args.workers} workers")
    print(f"process pool        {t_pool:8.1f} s   {n / t_pool:6.3f} runs/s")
    print(f"ray (incl. start)   {t_start + t_runs:8.1f} s   {n / (t_start + t_runs):6.3f} runs/s   (start {t_start:.1f} s)")
    print(f"ray (runs only)     {t_runs:8.1f} s   {n / t_runs:6.3f} runs/s")
    print(f"ratio Ray/pool throughput: {t_pool / (t_start + t_runs):.2f}× incl. start, {t_pool / t_runs:.2f}× runs only "
          f"(goal ≥ 0.9×); identical tables: {same and rayed.done == pool.done}")


if __name__ == "__main__":
    main()
