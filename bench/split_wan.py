"""Split training over a shaped network: steps/s and final accuracy for round-trip times × bandwidths,
synchronous vs pipelined driver, in one run (issue #27).

Two real party processes (alice: inputs and the first layers; bob: the rest and the labels; gRPC + mutual TLS)
are started once. For every cell, each party is reached through its own :class:`ShapingProxy` (one-way delay
RTT/2 in each direction, the bandwidth limit per direction): the driver→alice link, the alice→bob link that
carries the activations and gradients (alice dials bob at the address the driver gives her, the proxy's), and the
driver's control link to bob all pay the round trip and the bandwidth. Every cell restores both parties to step 0
and trains ``--steps`` steps from there, once with the synchronous driver (``pipeline=False``: one step in flight)
and once pipelined (``pipeline=True``: step s+1 is sent, carrying the commit of step s, before step s is
answered). steps/s is measured between the end of the first step and the end of the last (connection set-up and
the evaluations at step 0 and at the end are not counted); the final accuracy is 1 − the test error at the end.

    python bench/split_wan.py [--steps 12] [--rtt 0,20,50,100] [--bw 10,100,1000] [--batch 64]
                              [--channels 16,32] [--fc 64] [--cut conv1]

Bounded: 4 × 3 × 2 = 24 short runs of ``--steps`` steps each (about 3 minutes at the defaults on a quiet host).
"""

from __future__ import annotations

import argparse
import os
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


def run_cell(split, tc: TrainConfig, seed: int, rtt_ms: float, bw_mbit: float, pipeline: bool
             ) -> tuple[float, float, float]:
    """One training run through fresh proxies; returns (steps/s, final accuracy, alice<->bob wire KiB per step
    as alice reports it: since the party started, so averaged over every cell run so far)."""
    proxies = {n: ShapingProxy(p.address, delay_ms=rtt_ms / 2, rate_mbit=bw_mbit).start()
               for n, p in split.processes.items()}
    try:
        cfg = split.split_config(tc, seed, connect_timeout_s=20.0, timeout_s=120.0)
        cfg.parties = [PartyRef(name=p.name, address=proxies[p.name].address, cert=p.cert) for p in cfg.parties]
        marks: list[float] = []
        with SplitDriver(cfg, pipeline=pipeline) as drv:
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
    args = ap.parse_args()
    torch.set_num_threads(1)
    rtts = [float(r) for r in args.rtt.split(",")]
    bws = [float(b) for b in args.bw.split(",")]
    data = load_data(DataConfig(source="digits"))
    mcfg = ModelConfig(arch="cnn", channels=[int(c) for c in args.channels.split(",")], fc=args.fc)
    model = init_model_(build_model(mcfg, (1, 8, 8), 10), seed=args.seed)
    tc = TrainConfig(steps=args.steps, eval_every=args.steps, batch_size=args.batch, eval_batch_size=1024,
                     loss="error", lr=0.05, momentum=0.9)
    print(f"model: cnn channels={mcfg.channels} fc={mcfg.fc} on digits, batch {args.batch}, cut after {args.cut}; "
          f"{args.steps} steps per cell; every link through a ShapingProxy")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        split = prepare_local_split(Path(tmp), model, data, ["alice", "bob"], [args.cut], threads=1,
                                    checkpoint_every=args.steps)
        split.start()
        try:
            for rtt in rtts:
                for bw in bws:
                    sync = run_cell(split, tc, args.seed, rtt, bw, pipeline=False)
                    pipe = run_cell(split, tc, args.seed, rtt, bw, pipeline=True)
                    rows.append((rtt, bw, sync, pipe))
                    print(f"  RTT {rtt:>5.0f} ms  {bw:>6.0f} Mbit/s: sync {sync[0]:6.2f} steps/s acc {sync[1]:.4f}"
                          f" | pipelined {pipe[0]:6.2f} steps/s acc {pipe[1]:.4f}  (alice<->bob {pipe[2]:.0f} KiB "
                          f"per call)", flush=True)
        finally:
            split.stop()
    print()
    print("| RTT (ms) | bandwidth (Mbit/s) | sync steps/s | pipelined steps/s | speed-up | sync acc | pipelined acc |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for rtt, bw, (rs, acs, _), (rp, acp, _) in rows:
        print(f"| {rtt:.0f} | {bw:.0f} | {rs:.2f} | {rp:.2f} | {rp / rs:.2f}× | {acs:.4f} | {acp:.4f} |")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
