"""The guard's state under a spent key and a large detector history (issue #37 done-when), and two replicas on one
PostgreSQL (issue #40), in one run.

    nice -n 10 .venv/bin/python bench/guard_state.py [--minutes 10] [--clients 8] [--prefill 200000]
                                                     [--replica-seconds 60] [--no-replicas]

1. A `guard serve` subprocess (the shipped configuration: ModelGuard-S ε = 1, watermark and detector on, SQLite
   store) whose store is prefilled with ``--prefill`` detector rows (bounded states: full windows and growing sets
   of the clients' own keys, then of idle keys). **Baseline**: ``clients − 1`` clients, each with its own key,
   send 16-row requests in a closed loop (keep-alive, one process each) for a fifth of ``--minutes``, while a
   checker calls ``/v2/health/ready`` every 100 ms. **Under attack**: the same plus one client retrying a spent key
   as fast as it can, for ``--minutes``. Prints p50/p99 of the other keys' requests and of the health checks in
   both phases and their ratios (goals: p99 < 50 ms for the keys, < 100 ms for health).
2. Two replicas on one throwaway PostgreSQL (where one can be started): ``clients`` clients alternate replicas on
   one key with a budget, for ``--replica-seconds``: answered rows per second, p50/p99, and exactness (rows answered
   = rows charged = the budget when it ran out).

Writes ``bench-guard-state.json`` in the working directory.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from modelward.core.zoo import ModelConfig, build_model
from modelward.extraction.guard.process import start_guard_server, write_guard_config
from modelward.extraction.guard.store import open_store
from modelward.extraction.ownership.detector import PradaDetector

SHAPE, K, ROWS = (1, 8, 8), 10, 16
NET = ModelConfig(arch="mlp", hidden=[64])


def _body(rng: np.random.Generator) -> bytes:
    x = rng.random((ROWS, *SHAPE), dtype=np.float32)
    return json.dumps({"inputs": [{"name": "input", "shape": [ROWS, *SHAPE], "datatype": "FP32",
                                   "data": x.ravel().tolist()}]}).encode()


def _client(urls: list[str], key: str, until: float, seed: int, out: mp.Queue, stop_on_429: bool = False) -> None:
    import httpx

    rng = np.random.default_rng(seed)
    lat, codes = [], {}
    with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"}) as h:
        j = 0
        while time.time() < until:
            body = _body(rng)
            t = time.perf_counter()
            try:
                r = h.post(f"{urls[j % len(urls)]}/v2/models/m/infer", content=body)
                code = r.status_code
            except httpx.HTTPError:
                code = -1
            lat.append((time.perf_counter() - t) * 1e3)
            codes[code] = codes.get(code, 0) + 1
            j += 1
            if stop_on_429 and code == 429:
                break
    out.put((f"{key}#{seed}", lat, codes))


def _health(url: str, until: float, out: mp.Queue) -> None:
    import httpx

    lat = []
    with httpx.Client(timeout=60) as h:
        while time.time() < until:
            t = time.perf_counter()
            h.get(f"{url}/v2/health/ready")
            lat.append((time.perf_counter() - t) * 1e3)
            time.sleep(0.1)
    out.put(("health", lat, {}))


def _pct(v: list[float]) -> dict[str, float]:
    a = np.asarray(v) if v else np.zeros(1)
    return {"n": len(v), "p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "max": float(a.max())}


def _prefill(store_path: Path, rows: int, keys: list[str]) -> dict[str, int]:
    """Bounded detector states (full windows of 1,000 distances and their growing sets), the clients' keys first,
    then idle keys until the store holds ``rows`` detector rows."""
    store = open_store(None, store_path)
    rng = np.random.default_rng(0)
    names = iter(keys + [f"idle{i}" for i in range(10**6)])
    while sum(store.detector_rows().values()) < rows:
        name = next(names)
        det = PradaDetector()
        x = torch.from_numpy(rng.random((1200, int(np.prod(SHAPE))), dtype=np.float32))
        y = torch.from_numpy(rng.integers(0, K, 1200))
        for i in range(0, len(x), 300):
            with store.transaction() as txn:
                up = det.prepare(name, x[i : i + 300], y[i : i + 300])
                txn.write_detector(up, det.window)
            det.apply(up)
    counts = store.detector_rows()
    store.close()
    return counts


def phase(urls: list[str], keys: list[str], seconds: float, spent: str | None) -> dict:
    q: mp.Queue = mp.Queue()
    until = time.time() + seconds
    procs = [mp.Process(target=_client, args=(urls, k, until, i, q)) for i, k in enumerate(keys)]
    print(f"  {len(procs) + (spent is not None) + 1} processes until {time.strftime('%H:%M:%S', time.localtime(until))}",
          flush=True)
    if spent is not None:
        procs.append(mp.Process(target=_client, args=(urls, spent, until, 99, q)))
    procs.append(mp.Process(target=_health, args=(urls[0], until, q)))
    for p in procs:
        p.start()
    res = [q.get(timeout=seconds + 300) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    is_spent = f"{spent}#99"
    others = [x for k, lat, _ in res if k not in ("health", is_spent) for x in lat]
    codes: dict[str, dict] = {k: c for k, _, c in res if k != "health"}
    out = {"keys": _pct(others), "health": next(_pct(lat) for k, lat, _ in res if k == "health"), "codes": codes,
           "answered_per_s": sum(c.get(200, 0) for c in codes.values()) * ROWS / seconds}
    if spent is not None:
        out["spent_key_requests_per_s"] = sum(next(c for k, _, c in res if k == is_spent).values()) / seconds
        out["answered_per_s"] -= codes[is_spent].get(200, 0) * ROWS / seconds
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--prefill", type=int, default=200_000)
    ap.add_argument("--replica-seconds", type=float, default=60.0)
    ap.add_argument("--no-replicas", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = build_model(NET, SHAPE, K)
    work = Path(tempfile.mkdtemp(prefix="bench-guard-state-"))
    keys = {f"bench-key-{i:02d}-0123456789": None for i in range(args.clients - 1)}
    spent = "bench-key-spent-0123456789"
    path = write_guard_config(work / "g", model, NET, SHAPE, K, defense="modelguard_s", defense_params={"epsilon": 1.0},
                              keys={**keys, spent: 0}, name="m", server={"max_connections_per_client": 64},
                              ownership={"watermark": {}, "detector": {}})
    names = [f"key{i}" for i in range(len(keys))]
    t0 = time.time()
    counts = _prefill(work / "g" / "guard_state" / "queries.sqlite", args.prefill, names)
    print(f"store prefilled in {time.time() - t0:.0f} s: {counts} ({sum(counts.values())} detector rows)", flush=True)
    out: dict = {"args": vars(args), "prefill": counts}
    with start_guard_server(path) as srv:
        base_s = max(10.0, args.minutes * 60 / 5)
        print(f"baseline: {len(keys)} clients, {base_s:.0f} s", flush=True)
        out["baseline"] = phase([srv.url], list(keys), base_s, None)
        print(f"under attack: {len(keys)} clients + 1 retrying a spent key, {args.minutes * 60:.0f} s", flush=True)
        out["attack"] = phase([srv.url], list(keys), args.minutes * 60, spent)
    b, a = out["baseline"], out["attack"]
    print(f"\n{'phase':<14} {'key p50':>8} {'key p99':>8} {'health p50':>11} {'health p99':>11} {'rows/s':>8} "
          f"{'429/s':>7}")
    print("status codes:", {n: {c: sum(v.get(c, 0) for v in r["codes"].values()) for c in (200, 429, 503, -1)}
                             for n, r in (("baseline", b), ("spent-key", a))})
    for name, r in (("baseline", b), ("spent-key", a)):
        print(f"{name:<14} {r['keys']['p50']:>7.1f}ms {r['keys']['p99']:>7.1f}ms {r['health']['p50']:>10.1f}ms "
              f"{r['health']['p99']:>10.1f}ms {r['answered_per_s']:>8.0f} {r.get('spent_key_requests_per_s', 0):>7.0f}")
    print(f"ratio (spent-key / baseline): key p99 {a['keys']['p99'] / b['keys']['p99']:.2f}, health p99 "
          f"{a['health']['p99'] / b['health']['p99']:.2f}; goals: key p99 < 50 ms: "
          f"{'met' if a['keys']['p99'] < 50 else 'NOT met'}, health p99 < 100 ms: "
          f"{'met' if a['health']['p99'] < 100 else 'NOT met'}")

    if not args.no_replicas:
        from modelward.extraction.guard.store.pgtest import find_postgres, fresh_database, throwaway_postgres

        found = find_postgres()
        if isinstance(found, str):
            print(f"\nreplicas: skipped ({found})")
        else:
            with throwaway_postgres() as url:
                db = fresh_database(url, "bench")
                budget = 10**9
                shared = "bench-key-shared-0123456789"
                paths = []
                for i in range(2):
                    p = write_guard_config(work / f"r{i}", model, NET, SHAPE, K, defense="modelguard_s",
                                           defense_params={"epsilon": 1.0}, keys={shared: budget}, name="m",
                                           server={"store_url": db, "max_connections_per_client": 64},
                                           ownership={"watermark": {}, "detector": {}})
                    (work / f"r{i}" / "guard_state").mkdir(parents=True, exist_ok=True)
                    (work / f"r{i}" / "guard_state" / "watermark.key").write_bytes(b"bench-guard-state-watermark-k-32")
                    paths.append(p)
                servers = [start_guard_server(p) for p in paths]
                try:
                    r = phase([s.url for s in servers], [shared] * args.clients, args.replica_seconds, None)
                finally:
                    for s in servers:
                        s.stop()
                import psycopg

                with psycopg.connect(db) as c:
                    used = c.execute("SELECT used FROM usage WHERE key_name = 'key0'").fetchone()[0]
                    logged = c.execute("SELECT COALESCE(SUM(rows), 0) FROM queries WHERE status = 200").fetchone()[0]
                got = sum(cd.get(200, 0) for cd in r["codes"].values()) * ROWS
                r.update({"rows_charged": int(used), "rows_logged": int(logged), "rows_received": got})
                out["replicas"] = r
                print(f"\ntwo replicas on one PostgreSQL, {args.clients} clients on one key: {r['answered_per_s']:.0f} "
                      f"rows/s, p50 {r['keys']['p50']:.1f} ms, p99 {r['keys']['p99']:.1f} ms; rows received "
                      f"{got}, charged {used}, logged {logged} ({'exact' if got == used == logged else 'NOT exact'})")
    with open("bench-guard-state.json", "w") as fh:
        json.dump(out, fh, indent=2)
    print("written bench-guard-state.json")


if __name__ == "__main__":
    main()
