"""The guarded prediction service against KServe's ModelServer, on loopback: throughput, p50/p99 latency, errors.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/guard_service.py [--clients 8] [--requests 25] [--batch 16]
        [--rounds 5] [--servers kserve,direct,proxy] [--ownership] [--baseline-src /path/to/main/src] [--paired 400]

One run measures servers serving the same weights (the digits CNN), each in its own subprocess, side by side:

* ``kserve``: KServe's Python ``ModelServer`` (examples/deploy/kserve_model.py) from the bench-only environment
  ``.venv-kserve`` (KServe pins protobuf, pandas and python-dateutil versions of its own, so it never touches
  modelward's; ``MODELWARD_KSERVE_PYTHON`` names another interpreter), answering logits — what a team runs today;
* ``direct``: ``modelward guard serve`` with ModelGuard-S (ε = 1) loading the weights itself;
* ``proxy``: ``modelward guard serve`` with ModelGuard-S in proxy mode in front of the ``kserve`` server (the weights
  stay in KServe): its latency over KServe's alone is the proxy's overhead;
* ``proxy-none`` (on request): the same with defense "none": the proxy's own machinery (key, HTTP hop, charge,
  log), without the defense's cost;
* ``relay`` (on request): a bare uvicorn app forwarding each body to the ``kserve`` server with the guard's
  upstream client and its answer back (no key, parse, charge, defense or log): the floor of a Python proxy;
* ``bare`` (on request): the model behind a plain FastAPI handler (no defense, no key, no log; uvicorn's defaults:
  httptools and uvloop where installed, as in the guard since guard-perf3).

``--ownership`` turns the answer watermark and the extraction detector on in the guards (the shipped GUARD.toml);
without it they are off, as in the earlier rows of BENCHMARKS.md. Each round loads each server in turn with
``--clients`` concurrent clients (keep-alive connections) and then with a single client, so a change of the shared
machine's load hits all alike; the script prints medians over the rounds, per-round ratios and the load average
before and after, and each server's CPU time per request (its processes' user + system time from
``/proc/<pid>/stat`` over the timed requests: robust to the machine's load, unlike latency). ``--baseline-src DIR``
adds a second copy of each guard server (named ``direct@base``, …) running the modelward sources in DIR (e.g. a
checkout of main) with uvloop and httptools hidden from it, so a change is measured against its baseline in the
same rounds. Goals (issue 40): direct ≥ 1.0× KServe's throughput, p99 ≤ 5 ms at one client, proxy overhead
≤ 1 ms p50 over KServe alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import torch
from fastapi import Request

from modelward.core.zoo import ModelConfig, build_model
from modelward.extraction.guard.process import (
    KSERVE_PYTHON,
    free_port,
    start_guard_server,
    start_kserve_model,
    write_guard_config,
)

KEY = "bench-key-0000"


def bare_server(config: str, port: int) -> None:
    """The baseline: the same model behind a plain FastAPI/uvicorn handler (no defense, no auth, no log)."""
    import uvicorn
    from fastapi import FastAPI

    from modelward.extraction.guard.config import load_guard_config
    from modelward.extraction.guard.service import load_weights

    cfg = load_guard_config(config)
    model = build_model(cfg.model.net, tuple(cfg.model.input_shape), cfg.model.num_classes)
    load_weights(model, Path(config).parent / cfg.model.checkpoint, "model.checkpoint")
    app = FastAPI()

    @app.get("/v2/health/ready")
    async def ready() -> dict[str, bool]:
        return {"ready": True}

    @app.post("/v2/models/{name}/infer")
    async def infer(name: str, request: Request) -> dict:
        t = (await request.json())["inputs"][0]
        x = torch.from_numpy(np.asarray(t["data"], dtype=np.float32).reshape(t["shape"]))
        with torch.no_grad():
            p = torch.softmax(model(x), 1)
        return {"model_name": name, "outputs": [{"name": "probabilities", "datatype": "FP32",
                                                 "shape": list(p.shape), "data": p.flatten().tolist()}]}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def relay_server(upstream: str, port: int) -> None:
    """The floor of any Python proxy: uvicorn (httptools, uvloop) and the guard's upstream client forwarding each
    request body to the upstream as it came and its answer back — no key, no parsing, no charge, no defense, no log."""
    import uvicorn

    from modelward.extraction.guard.config import UpstreamSection
    from modelward.extraction.guard.proxy import UpstreamClient

    client = UpstreamClient(UpstreamSection(url=upstream, model="digits", output="logits"), Path("."))

    async def app(scope, receive, send) -> None:  # noqa: ANN001 - plain ASGI
        if scope["type"] != "http":
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        status, _, payload = await client.request(scope["method"], scope["path"], body,
                                                  "Content-Type: application/json\r\n")
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="off")


def start_bare(config: Path | str, relay: bool = False) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    flag = "--relay-server" if relay else "--bare-server"
    proc = subprocess.Popen([sys.executable, __file__, flag, str(config), "--port", str(port)], env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180  # a loaded shared machine starts a server slowly
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=1.0).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("bare server did not start")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` and its descendants (every thread), from ``/proc``."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14, 15 of stat(5))
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, IndexError, ValueError):
            continue  # the process ended
    return total


def load(url: str, name: str, clients: int, requests: int, batch: int, pid: int | None = None) -> dict[str, float]:
    lat: list[float] = []
    errors = [0]
    lock = threading.Lock()
    bodies = []
    g = torch.Generator().manual_seed(0)
    for _ in range(64):
        x = torch.rand(batch, 1, 8, 8, generator=g)
        bodies.append(json.dumps({"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                                              "data": x.flatten().tolist()}]}).encode())
    barrier = threading.Barrier(clients + 1)

    def client(i: int) -> None:
        headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        with httpx.Client(base_url=url, headers=headers, timeout=30) as c:
            c.get("/v2/health/ready")  # open the keep-alive connection before timing
            barrier.wait()
            for r_i in range(requests):
                t0 = time.perf_counter()
                r = c.post(f"/v2/models/{name}/infer", content=bodies[(i * requests + r_i) % len(bodies)])
                dt = time.perf_counter() - t0
                with lock:
                    lat.append(dt)
                    if r.status_code != 200:
                        errors[0] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    cpu0 = cpu_seconds(pid) if pid else 0.0
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    cpu = cpu_seconds(pid) - cpu0 if pid else float("nan")
    arr = np.array(lat) * 1e3
    return {"rows_per_s": clients * requests * batch / wall, "req_per_s": clients * requests / wall,
            "p50_ms": float(np.percentile(arr, 50)), "p99_ms": float(np.percentile(arr, 99)),
            "cpu_ms": cpu * 1e3 / (clients * requests), "errors": errors[0]}


def paired(urls: dict[str, str], name: str, requests: int, batch: int, pids: dict[str, int]) -> dict[str, dict]:
    """One client sending the same request to every server in turn (the order rotates), ``requests`` times: the
    latency of each server next to the others' at the same moment, so the load of the moment cancels in the
    per-request differences."""
    g = torch.Generator().manual_seed(1)
    bodies = []
    for _ in range(64):
        x = torch.rand(batch, 1, 8, 8, generator=g)
        bodies.append(json.dumps({"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                                              "data": x.flatten().tolist()}]}).encode())
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    clients = {s: httpx.Client(base_url=u, headers=headers, timeout=30) for s, u in urls.items()}
    names = list(urls)
    lat: dict[str, list[float]] = {s: [] for s in names}
    cpu0 = {s: cpu_seconds(pids[s]) for s in names if s in pids}
    try:
        for c in clients.values():
            c.get("/v2/health/ready")
        for i in range(requests):
            body = bodies[i % len(bodies)]
            k = i % len(names)
            for s in names[k:] + names[:k]:
                t0 = time.perf_counter()
                r = clients[s].post(f"/v2/models/{name}/infer", content=body)
                lat[s].append(time.perf_counter() - t0)
                assert r.status_code == 200, (s, r.status_code, r.text[:200])
    finally:
        for c in clients.values():
            c.close()
    return {s: {"lat": np.array(v) * 1e3, "cpu_ms": (cpu_seconds(pids[s]) - cpu0[s]) * 1e3 / requests
                if s in cpu0 else float("nan")} for s, v in lat.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=25, help="requests per client per round")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (the CPU is shared: medians)")
    ap.add_argument("--servers", default="kserve,direct,proxy",
                    help="comma-separated: kserve, direct, proxy, proxy-none, relay, bare")
    ap.add_argument("--ownership", action="store_true", help="watermark and detector on in the guards (shipped)")
    ap.add_argument("--baseline-src", default=None,
                    help="also run each guard server from the modelward sources in this folder (a checkout's src/), "
                         "named SERVER@base, without uvloop and httptools: before/after in the same rounds")
    ap.add_argument("--paired", type=int, default=0,
                    help="after the rounds: this many requests from one client to every server in turn (per-request "
                         "differences from kserve: the proxy's overhead with the moment's load cancelled)")
    ap.add_argument("--bare-server", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--relay-server", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.bare_server:
        bare_server(args.bare_server, args.port)
        return
    if args.relay_server:
        relay_server(args.relay_server, args.port)
        return
    servers = tuple(args.servers.split(","))
    if args.baseline_src:
        servers += tuple(f"{s}@base" for s in servers if s in ("direct", "proxy", "proxy-none"))
    if any(s in servers for s in ("kserve", "proxy", "proxy-none", "relay")) and not KSERVE_PYTHON.is_file():
        raise SystemExit(f"no KServe environment at {KSERVE_PYTHON}: see examples/deploy/README.md (make kserve-env)")
    cfg = ModelConfig(arch="cnn", channels=[16, 32], fc=64)
    torch.manual_seed(0)
    model = build_model(cfg, (1, 8, 8), 10)
    own = {"watermark": {"enabled": True}, "detector": {"enabled": True}} if args.ownership else None
    runs: dict[tuple[str, int], list[dict[str, float]]] = {(s, c): [] for s in servers for c in (args.clients, 1)}
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        urls, stops, pids = {}, [], {}
        base_env = None
        if args.baseline_src:  # the baseline's sources first on the path; uvloop and httptools hidden from it
            hide = Path(tmp) / "hide"
            for mod in ("uvloop", "httptools"):
                (hide / mod).mkdir(parents=True)
                (hide / mod / "__init__.py").write_text(f"raise ImportError('{mod} hidden by bench/guard_service.py')\n")
            base_env = {"PYTHONPATH": os.pathsep.join([str(hide), str(Path(args.baseline_src).resolve())])}
        try:
            kserve_url = None
            order = sorted(servers, key=lambda s: s != "kserve")  # the upstream first: the proxy needs its url
            for server in order:
                d = Path(tmp) / server.replace("@", "-")
                kind = server.split("@")[0]
                if server == "kserve":
                    write_guard_config(d, model, cfg, (1, 8, 8), 10, keys={KEY: None}, name="digits")
                    up = start_kserve_model(d / "model.safetensors", "digits", (1, 8, 8), 10, output="logits")
                    urls[server] = kserve_url = up.url
                    stops.append(up.stop)
                    pids[server] = up.proc.pid
                elif server == "bare":
                    path = write_guard_config(d, model, cfg, (1, 8, 8), 10, defense="none", keys={KEY: None},
                                              name="digits")
                    proc, urls[server] = start_bare(path)
                    stops.append(proc.kill)
                    pids[server] = proc.pid
                elif server == "relay":
                    proc, urls[server] = start_bare(str(kserve_url), relay=True)
                    stops.append(proc.kill)
                    pids[server] = proc.pid
                else:
                    proxied = kind.startswith("proxy")
                    upstream = {"url": kserve_url, "model": "digits", "output": "logits"} if proxied else None
                    none = kind == "proxy-none"
                    path = write_guard_config(d, None if upstream else model, cfg, (1, 8, 8), 10,
                                              defense="none" if none else "modelguard_s",
                                              defense_params={} if none else {"epsilon": 1.0},
                                              keys={KEY: None}, name="digits", ownership=own, upstream=upstream)
                    srv = start_guard_server(path, timeout=180, env=base_env if "@" in server else None)
                    urls[server] = srv.url
                    stops.append(srv.stop)
                    pids[server] = srv.proc.pid
                load(urls[server], "digits", 2, 5, args.batch)  # warm-up
            for _ in range(args.rounds):
                for server in servers:
                    runs[(server, args.clients)].append(load(urls[server], "digits", args.clients, args.requests,
                                                             args.batch, pids.get(server)))
                    runs[(server, 1)].append(load(urls[server], "digits", 1, args.requests * 2, args.batch,
                                                  pids.get(server)))
            pair = paired({s: urls[s] for s in servers}, "digits", args.paired, args.batch, pids) if args.paired else {}
        finally:
            for stop in stops:
                stop()
    med = {k: {m: float(np.median([r[m] for r in v])) for m in v[0]} for k, v in runs.items()}
    print(f"{args.rounds} interleaved rounds; per round {args.requests} requests per client × {args.batch} rows "
          f"(1 client: {2 * args.requests}); keep-alive connections, loopback, {os.cpu_count()} CPUs, load average "
          f"{load0[0]:.1f} before, {os.getloadavg()[0]:.1f} after; ownership (watermark + detector) "
          f"{'on' if args.ownership else 'off'}; medians over rounds")
    print(f"{'server':>16} {'clients':>7} {'rows/s':>8} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'CPU ms/req':>10} "
          f"{'errors':>6}")
    for (d, c), r in med.items():
        print(f"{d:>16} {c:>7} {r['rows_per_s']:>8.0f} {r['req_per_s']:>7.1f} {r['p50_ms']:>7.2f} "
              f"{r['p99_ms']:>7.2f} {r['cpu_ms']:>10.2f} {sum(x['errors'] for x in runs[(d, c)]):>6}")
    base = "kserve" if "kserve" in servers else "bare"
    for c in (args.clients, 1):
        for d in (s for s in servers if s != base):
            ratios = [g["rows_per_s"] / b["rows_per_s"] for g, b in zip(runs[(d, c)], runs[(base, c)], strict=True)]
            print(f"{c} client(s): {d} / {base} throughput, median of per-round ratios {np.median(ratios):.2f} "
                  f"(rounds: {', '.join(f'{x:.2f}' for x in ratios)})")
    for d in (s for s in servers if "@" in s):
        new = d.split("@")[0]
        for c in (args.clients, 1):
            ratios = [n["rows_per_s"] / b["rows_per_s"] for n, b in zip(runs[(new, c)], runs[(d, c)], strict=True)]
            cpu = [n["cpu_ms"] / b["cpu_ms"] for n, b in zip(runs[(new, c)], runs[(d, c)], strict=True)]
            print(f"{c} client(s): {new} / {d} throughput {np.median(ratios):.2f}, CPU per request "
                  f"{np.median(cpu):.2f} (medians of per-round ratios)")
    for proxy in (s for s in servers if s.startswith(("proxy", "relay"))):
        if "kserve" not in servers:
            break
        over = [p["p50_ms"] - k["p50_ms"] for p, k in zip(runs[(proxy, 1)], runs[("kserve", 1)], strict=True)]
        print(f"1 client: {proxy} p50 - kserve p50, median of per-round differences {np.median(over):.2f} ms "
              f"(rounds: {', '.join(f'{x:.2f}' for x in over)})")
    if pair:
        print(f"paired, 1 client, {args.paired} requests to each server in turn: p50 / p99 ms, CPU ms per request "
              f"(kserve's includes the proxies' requests to it), the median of per-request differences from kserve")
        for s, r in pair.items():
            diff = (f", {s} - kserve: median {np.median(r['lat'] - pair['kserve']['lat']):.2f} ms"
                    if "kserve" in pair and s != "kserve" else "")
            print(f"{s:>16}: p50 {np.percentile(r['lat'], 50):.2f}, p99 {np.percentile(r['lat'], 99):.2f}, "
                  f"CPU {r['cpu_ms']:.2f}{diff}")
    assert all(r["errors"] == 0 for v in runs.values() for r in v)


if __name__ == "__main__":
    main()
