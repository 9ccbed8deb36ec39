"""The guard's request path in process, with SQLite's WAL checkpoints inside the commits (SQLite's default) and in
the server's checkpoint thread (``guard serve`` since guard-perf3): p50 / p99 of ``GuardService.handle``.

    OMP_NUM_THREADS=1 .venv/bin/python bench/guard_wal_tail.py [--requests 3000] [--blocks 6]

Two services (the digits CNN, ModelGuard-S ε = 1, watermark and detector on: the shipped config; one SQLite store
each) answer the same 16-row requests in alternating blocks, so the machine's load hits both alike. With SQLite's
automatic checkpoint, the commit that fills 1,000 WAL pages copies them into the database and syncs it (every
~50th request here); with the thread no commit does. No sockets: the HTTP stack is not measured.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from modelward.core.zoo import ModelConfig, build_model
from modelward.extraction.guard.process import write_guard_config
from modelward.extraction.guard.service import build_service


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=3000, help="timed requests per service")
    ap.add_argument("--blocks", type=int, default=6, help="alternating blocks the requests are split into")
    args = ap.parse_args()
    cfg = ModelConfig(arch="cnn", channels=[16, 32], fc=64)
    torch.manual_seed(0)
    model = build_model(cfg, (1, 8, 8), 10)
    g = torch.Generator().manual_seed(0)
    bodies = [json.dumps({"inputs": [{"name": "input", "shape": [16, 1, 8, 8], "datatype": "FP32",
                                      "data": torch.rand(16, 1, 8, 8, generator=g).flatten().tolist()}]}).encode()
              for _ in range(64)]
    own = {"watermark": {"enabled": True}, "detector": {"enabled": True}}
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        services = {}
        for mode in ("in the commits", "in a thread"):
            path = write_guard_config(Path(tmp) / mode.replace(" ", "-"), model, cfg, (1, 8, 8), 10,
                                      defense="modelguard_s", defense_params={"epsilon": 1.0},
                                      keys={"bench-key-0000": None}, name="digits", ownership=own)
            svc = build_service(path)
            if mode == "in a thread":
                svc.start_key_refresh()  # what guard serve does: key refresh, retention and the WAL checkpoints
            services[mode] = svc
        lat: dict[str, list[float]] = {m: [] for m in services}
        try:
            for svc in services.values():  # warm-up
                key = svc.keys["bench-key-0000"]
                for i in range(200):
                    svc.handle(key, bodies[i % 64], None)
            per = args.requests // args.blocks
            for b in range(args.blocks):
                for mode in (list(services) if b % 2 == 0 else list(services)[::-1]):
                    svc = services[mode]
                    key = svc.keys["bench-key-0000"]
                    for i in range(per):
                        t0 = time.perf_counter()
                        svc.handle(key, bodies[i % 64], None)
                        lat[mode].append((time.perf_counter() - t0) * 1e3)
        finally:
            for svc in services.values():
                svc.close()
    print(f"{args.requests} requests per service in {args.blocks} alternating blocks, load average {load0:.1f} "
          f"before, {os.getloadavg()[0]:.1f} after")
    for mode, v in lat.items():
        a = np.array(v)
        print(f"WAL checkpoints {mode:>15}: p50 {np.percentile(a, 50):.2f} ms, p99 {np.percentile(a, 99):.2f} ms, "
              f"max {a.max():.1f} ms")


if __name__ == "__main__":
    main()
