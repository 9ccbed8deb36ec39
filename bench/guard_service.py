"""The guarded prediction service under 8 concurrent loopback clients: throughput, p50/p99 latency, errors.

    .venv/bin/python bench/guard_service.py [--clients 8] [--requests 40] [--batch 16]

Runs the same load against two servers in one go — the model unguarded (defense "none") and guarded by
ModelGuard-S — and prints the guarded/unguarded throughput ratio. Bounded: clients × requests requests each.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import torch

from modelward.core.zoo import ModelConfig, build_model
from modelward.extraction.service_process import start_guard_server, write_guard_config

KEY = "bench-key-0000"


def load(url: str, name: str, clients: int, requests: int, batch: int) -> dict[str, float]:
    lat: list[float] = []
    errors = [0]
    lock = threading.Lock()

    def client(i: int) -> None:
        g = torch.Generator().manual_seed(i)
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as c:
            for _ in range(requests):
                x = torch.rand(batch, 1, 8, 8, generator=g)
                body = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                                    "data": x.flatten().tolist()}]}
                t0 = time.perf_counter()
                r = c.post(f"/v2/models/{name}/infer", json=body)
                dt = time.perf_counter() - t0
                with lock:
                    lat.append(dt)
                    if r.status_code != 200:
                        errors[0] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    arr = np.array(lat) * 1e3
    return {"rows_per_s": clients * requests * batch / wall, "req_per_s": clients * requests / wall,
            "p50_ms": float(np.percentile(arr, 50)), "p99_ms": float(np.percentile(arr, 99)), "errors": errors[0]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    cfg = ModelConfig(arch="cnn", channels=[16, 32], fc=64)
    torch.manual_seed(0)
    model = build_model(cfg, (1, 8, 8), 10)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for defense, params in (("none", {}), ("modelguard_s", {"epsilon": 1.0})):
            path = write_guard_config(Path(tmp) / defense, model, cfg, (1, 8, 8), 10, defense=defense,
                                      defense_params=params, keys={KEY: None}, name="digits")
            with start_guard_server(path) as server:
                load(server.url, "digits", 2, 3, args.batch)  # warm-up
                results[defense] = load(server.url, "digits", args.clients, args.requests, args.batch)
    print(f"{args.clients} clients × {args.requests} requests × {args.batch} rows, loopback")
    print(f"{'defense':>14} {'rows/s':>8} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'errors':>6}")
    for d, r in results.items():
        print(f"{d:>14} {r['rows_per_s']:>8.0f} {r['req_per_s']:>7.1f} {r['p50_ms']:>7.1f} {r['p99_ms']:>7.1f} "
              f"{r['errors']:>6}")
    ratio = results["modelguard_s"]["rows_per_s"] / results["none"]["rows_per_s"]
    print(f"guarded / unguarded throughput: {ratio:.2f}")
    assert all(r["errors"] == 0 for r in results.values())


if __name__ == "__main__":
    main()
