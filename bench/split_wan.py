"""Split training over a shaped network: steps/s and final accuracy for round-trip times × bandwidths,
synchronous vs pipelined driver vs bounded-staleness pipelining, in one run (issue #27).

Two real party processes (alice: inputs and the first layers; bob: the rest and the labels; gRPC + mutual TLS)
are started once. For every cell, each party is reached through its own :class:`ShapingProxy` (one-way delay
RTT/2 in each direction, the bandwidth limit per direction): the driver→alice link, the alice→bob link that
carries the activations and gradients (alice dials bob at the address the driver gives her, the proxy's), and the
driver's control link to bob all pay the round trip and the bandwidth. Every cell restores both parties to step 0
and trains ``--steps`` steps from there three times:

- ``sync``: the synchronous driver (``pipeline=False``: one step in flight; exact, bit-identical to monolithic);
- ``pipelined``: step s+1 is sent, carrying the commit of step s, before step s is answered (exact too: alice
  runs step s+1 once step s is through; only the driver↔alice round trip overlaps);
- ``stale k``: bounded staleness (``staleness=k``, default k = 1): alice sends the activations of step s+1 before
  the gradient of step s is back, so k + 1 steps are in flight on the alice↔bob link; her updates are delayed by k
  steps, with weight stashing (PipeDream-2BW, Narayanan et al. 2021). Not bit-identical; its accuracy is below.

steps/s is measured between the end of the first step and the end of the last (connection set-up and the
evaluations at step 0 and at the end are not counted); the final accuracy is 1 − the test error at the end (after
``--steps`` steps: a throughput run, not a converged model).

``--accuracy-seeds`` (default 0,1,2) adds the accuracy check on the demo model and recipe (``modelward demo``: CNN
[16, 32] fc 64 on digits, SGD lr 0.02 → 0.002 at step 400, momentum 0.9, weight decay 1e-4, batch 32, 600 steps,
cut after conv1), through the same two processes on loopback (no proxy: the network does not change the
arithmetic), sync vs stale k, one full run per data-order seed; ``--accuracy-seeds ""`` skips it.

    python bench/split_wan.py [--steps 12] [--rtt 0,20,50,100] [--bw 10,100,1000] [--batch 64]
                              [--channels 16,32] [--fc 64] [--cut conv1] [--staleness 1]
                              [--accuracy-seeds 0,1,2] [--accuracy-steps 600]

Bounded: 4 × 3 × 3 = 36 short runs of ``--steps`` steps each, plus 2 × 3 demo-sized runs (about 6 minutes at the
defaults on a quiet 2-vCPU host).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from modelward.core.data import DataConfig, load_data
from modelward.core.init import init_model_
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig, build_model
from modelward.governance.demo import prepare_local_split
from modelward.governance.driver import PartyRef, SplitDriver
from modelward.governance.transport.shaping import ShapingProxy


def run_cell(split, tc: TrainConfig, seed: int, rtt_ms: float, bw_mbit: float, pipeline: bool, staleness: int = 0
             ) -> tuple[float, float, float]:
    """One training run through fresh proxies (``rtt_ms`` None: no proxy, loopback); returns (steps/s, final
    accuracy, alice<->bob wire KiB per call as alice reports it: since the party started, so averaged over every
    cell run so far)."""
    proxies = {} if rtt_ms is None else {
        n: ShapingProxy(p.address, delay_ms=rtt_ms / 2, rate_mbit=bw_mbit).start() for n, p in split.processes.items()}
    try:
        cfg = split.split_config(tc, seed, connect_timeout_s=20.0, timeout_s=120.0)
        if proxies:
            cfg.parties = [PartyRef(name=p.name, address=proxies[p.name].address, cert=p.cert) for p in cfg.parties]
        marks: list[float] = []
        with SplitDriver(cfg, pipeline=pipeline, staleness=staleness) as drv:
            drv.open(train=True)
            for n in drv.names:  # every cell trains the same steps from the same state
                drv.call(n, "restore", 0, {"to_step": 0})
            res = drv.train(on_step=lambda s, loss, links: marks.append(time.perf_counter()))
        rate = (len(marks) - 1) / (marks[-1] - marks[0]) if len(marks) > 1 else float("nan")
        link = res.links.get("alice<->bob", {})
        kib = (link.get("sent", 0) + link.get("received", 0)) / 2**10 / max(1, link.get("calls", 1))
        return rate, 1.0 - res.curve[-1][1], kib
    finally:
        for px in proxies.values():
            px.stop()


def accuracy_check(seeds: list[int], staleness: int, steps: int) -> list[tuple[int, float, float, float, float]]:
    """The demo model and recipe, sync vs stale, one full run per data-order seed on loopback; returns
    ``[(seed, sync acc, stale acc, sync s, stale s)]``."""
    from modelward.completion.study import make_problem
    from modelward.demo import demo_study_config

    cfg = demo_study_config()
    problem = make_problem(cfg)
    tc = cfg.train.model_copy(update={"steps": steps, "eval_every": max(1, steps // 6)})
    data = problem.fit_split()  # what the demo's split training trains on, scored on the demo's validation split
    model = init_model_(problem.build(), "glorot_uniform", 0)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        split = prepare_local_split(Path(tmp), model, data, ["alice", "bob"], ["conv1"], threads=1,
                                    checkpoint_every=steps)
        split.start()
        try:
            for seed in seeds:
                t0 = time.perf_counter()
                sync = run_cell(split, tc, seed, None, 0, pipeline=True, staleness=0)
                t1 = time.perf_counter()
                stale = run_cell(split, tc, seed, None, 0, pipeline=True, staleness=staleness)
                t2 = time.perf_counter()
                out.append((seed, sync[1], stale[1], t1 - t0, t2 - t1))
                print(f"  seed {seed}: sync acc {sync[1]:.4f} ({t1 - t0:.0f} s) | stale {staleness} acc "
                      f"{stale[1]:.4f} ({t2 - t1:.0f} s) | difference {100 * (stale[1] - sync[1]):+.2f} points",
                      flush=True)
        finally:
            split.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=12, help="steps per cell (bounded run)")
    ap.add_argument("--rtt", default="0,20,50,100", help="round-trip times (ms), comma-separated")
    ap.add_argument("--bw", default="10,100,1000", help="bandwidths (Mbit/s per direction), comma-separated")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--channels", default="16,32")
    ap.add_argument("--fc", type=int, default=64)
    ap.add_argument("--cut", default="conv1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--staleness", type=int, default=1, help="k of the bounded-staleness column (1 or 2)")
    ap.add_argument("--accuracy-seeds", default="0,1,2", help="data-order seeds of the demo-sized accuracy check "
                    "(empty: skip it)")
    ap.add_argument("--accuracy-steps", type=int, default=600, help="steps of the accuracy check (the demo's 600)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    k = args.staleness
    rtts = [float(r) for r in args.rtt.split(",") if r]
    bws = [float(b) for b in args.bw.split(",") if b]
    data = load_data(DataConfig(source="digits"))
    mcfg = ModelConfig(arch="cnn", channels=[int(c) for c in args.channels.split(",")], fc=args.fc)
    model = init_model_(build_model(mcfg, (1, 8, 8), 10), seed=args.seed)
    tc = TrainConfig(steps=args.steps, eval_every=args.steps, batch_size=args.batch, eval_batch_size=1024,
                     loss="error", lr=0.05, momentum=0.9)
    print(f"model: cnn channels={mcfg.channels} fc={mcfg.fc} on digits, batch {args.batch}, cut after {args.cut}; "
          f"{args.steps} steps per cell; every link through a ShapingProxy; load average {os.getloadavg()[0]:.1f}")
    rows = []
    if rtts and bws:
        with tempfile.TemporaryDirectory() as tmp:
            split = prepare_local_split(Path(tmp), model, data, ["alice", "bob"], [args.cut], threads=1,
                                        checkpoint_every=args.steps)
            split.start()
            try:
                for rtt in rtts:
                    for bw in bws:
                        sync = run_cell(split, tc, args.seed, rtt, bw, pipeline=False)
                        pipe = run_cell(split, tc, args.seed, rtt, bw, pipeline=True)
                        stale = run_cell(split, tc, args.seed, rtt, bw, pipeline=True, staleness=k)
                        rows.append((rtt, bw, sync, pipe, stale))
                        print(f"  RTT {rtt:>5.0f} ms  {bw:>6.0f} Mbit/s: sync {sync[0]:6.2f} steps/s acc "
                              f"{sync[1]:.4f} | pipelined {pipe[0]:6.2f} acc {pipe[1]:.4f} | stale {k} "
                              f"{stale[0]:6.2f} acc {stale[1]:.4f}  (alice<->bob {stale[2]:.0f} KiB per call; "
                              f"load {os.getloadavg()[0]:.1f})", flush=True)
            finally:
                split.stop()
        print()
        print(f"| RTT (ms) | bandwidth (Mbit/s) | sync steps/s | pipelined steps/s | stale {k} steps/s | pipelined / "
              f"sync | stale {k} / sync | sync acc | pipelined acc | stale {k} acc |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for rtt, bw, (rs, acs, _), (rp, acp, _), (rk, ack, _) in rows:
            print(f"| {rtt:.0f} | {bw:.0f} | {rs:.2f} | {rp:.2f} | {rk:.2f} | {rp / rs:.2f}× | **{rk / rs:.2f}×** | "
                  f"{acs:.4f} | {acp:.4f} | {ack:.4f} |")
        print(f"(accuracy after {args.steps} steps: a throughput run)")
    seeds = [int(s) for s in args.accuracy_seeds.split(",") if s.strip()]
    if seeds:
        print(f"\naccuracy check: the demo model and recipe, {args.accuracy_steps} steps, sync vs stale {k}, "
              "loopback (2 party processes, mutual TLS)")
        acc = accuracy_check(seeds, k, args.accuracy_steps)
        d = [100 * (b - a) for _, a, b, _, _ in acc]
        print(f"| seed | sync acc | stale {k} acc | difference (points) |")
        print("|---:|---:|---:|---:|")
        for (seed, a, b, _, _), di in zip(acc, d, strict=True):
            print(f"| {seed} | {a:.4f} | {b:.4f} | {di:+.2f} |")
        mean_a = statistics.mean(a for _, a, _, _, _ in acc)
        mean_b = statistics.mean(b for _, _, b, _, _ in acc)
        print(f"| mean | {mean_a:.4f} | {mean_b:.4f} | {100 * (mean_b - mean_a):+.2f} |")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
