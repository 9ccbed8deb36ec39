"""Split training (2 parties, loopback, mutual TLS) vs monolithic training of the same model, in one run.

Prints the wall-time ratio split/monolithic (goals ≤ 1.3× for the compute-heavy configuration, ≤ 1.4× for the
default one) three ways — paired (median over the repetitions of each split run against the monolithic run just
before it), fastest runs, medians — and the bytes on the alice↔bob link (activations one way, gradients the
other, peer to peer) against the raw bytes of the activation and gradient tensors it must carry (goal ≤ 1.05×).
Both runs include the same evaluations. Every step is the full protocol: consent and audit on both parties, the
tentative update with its rollback copy, the numeric check and the two-phase commit.

    python bench/split_overhead.py [--steps 40] [--channels 64,128] [--fc 256] [--batch 128] [--cut conv1]
                                   [--driver both|process|hosted] [--integrity default|off|both]

Two deployments of the driver are measured: ``process`` (the driver in its own process, as `split train`
runs by default; one gRPC call driver→alice per step) and ``hosted`` (`split train --host alice.toml`: Alice's
organisation runs her party inside the driver's process, so a step crosses the network only between the parties).

The compute-heavy configuration used for the goal is ``--channels 16,512 --fc 2048 --steps 30``: Bob holds 4.2 M
parameters, and the activation crossing the cut is small (128 KB per batch). The parties checkpoint every 10 steps,
as in production, and this is part of the measured split time.

``--integrity both`` (issue 36: what the poisoning defence costs) measures, in the same run and alternating with
the monolithic runs, each deployment with the parties' shipped ``[integrity]`` (bounded steps, the trend detector)
and with ``integrity.enabled = false``, and prints the paired ratio defended/undefended (each defended run against
the undefended run just before it) beside the fastest-run and CPU ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from modelward.core.data import DataConfig, load_data
from modelward.core.init import init_model_
from modelward.core.process import keep_freed_memory
from modelward.core.train import TrainConfig, train
from modelward.core.zoo import ModelConfig, build_model
from modelward.governance.demo import prepare_local_split
from modelward.governance.driver import SplitDriver, hosted_connect
from modelward.governance.party.config import load_party_config
from modelward.governance.transport.server import hosted_party


def _cpu(pid: int) -> float:
    """user + system CPU seconds of a process (Linux /proc), 0 where unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--channels", default="64,128")
    ap.add_argument("--fc", type=int, default=256)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--cut", default="conv1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads in every process (same for both runs)")
    ap.add_argument("--driver", choices=["both", "process", "hosted"], default="both",
                    help="where the driver runs: its own process, hosted with alice's party, or both (alternating)")
    ap.add_argument("--integrity", choices=["default", "off", "both"], default="default",
                    help="the parties' [integrity]: the shipped defaults (bounded steps, trend detector), off, or "
                         "both (alternating: the defence's cost, paired)")
    ap.add_argument("--repeat", type=int, default=5, help="alternate monolithic and split runs this many times "
                                                          "(ratios: paired, fastest runs, medians)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    # as in `party serve` and `split train`: this process runs the monolithic baseline and, hosted, alice's party
    # (the baseline is unaffected by it: docs/benchmarks/governance.md)
    keep_freed_memory()

    data = load_data(DataConfig(source="digits"))
    mcfg = ModelConfig(arch="cnn", channels=[int(c) for c in args.channels.split(",")], fc=args.fc)
    model = init_model_(build_model(mcfg, (1, 8, 8), 10), seed=args.seed)
    tc = TrainConfig(steps=args.steps, eval_every=args.steps, batch_size=args.batch, eval_batch_size=1024)
    mono_model = copy.deepcopy(model)
    print(f"model: cnn channels={mcfg.channels} fc={mcfg.fc} on digits 1x8x8, batch {args.batch}, {args.threads} torch thread(s), "
          f"{args.steps} SGD steps; alice holds layers up to {args.cut}")

    def run_mono() -> tuple[float, float]:
        m = copy.deepcopy(mono_model)
        t0 = time.perf_counter()
        r = train(m, data.x_train, data.y_train, data.x_test, data.y_test, tc, seed=args.seed)
        return time.perf_counter() - t0, r.curve[-1][1]

    # monolithic and split runs alternate, `--repeat` times each, on the same parties (restored to step 0 before
    # every split run). Three wall-time ratios are printed. Paired: each split run against the monolithic run
    # just before it (seconds apart, so they see the same machine speed), median over the repetitions; this is
    # the one least moved by a host whose speed drifts between runs. Fastest runs: what the machine can do when
    # it is not busy with other work, but biased against the split runs where a core's speed varies from run to
    # run (the single-threaded monolithic run is more often lucky than three processes at once). Medians. CPU
    # seconds (this process + the party processes) are reported too: they do not depend on the load.
    drivers = ["process", "hosted"] if args.driver == "both" else [args.driver]
    arms = ["default", "off"] if args.integrity == "both" else [args.integrity]
    # a mode: where the driver runs, and the parties' [integrity] ("process", or "process/off" with --integrity both)
    modes = [d if a == arms[0] else f"{d}/{a}" for d in drivers for a in arms]
    arm_of = {m: arms[0] if "/" not in m else m.split("/")[1] for m in modes}
    monos, cpu_mono = [], []
    splits: dict[str, list[float]] = {m: [] for m in modes}
    cpu_split: dict[str, list[float]] = {m: [] for m in modes}
    results = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        # exact gradients (no label protection), and each party's shipped [integrity] (bounded steps, the trend
        # detector) unless --integrity off: what a step of a deployment costs
        integrity = {a: {p: {"integrity": {} if a == "default" else {"enabled": False}} for p in ("alice", "bob")}
                     for a in arms}
        locals_ = {m: prepare_local_split(Path(tmp) / m.replace("/", "-"), model, data, ["alice", "bob"], [args.cut],
                                          threads=args.threads, extra=integrity[arm_of[m]]) for m in modes}
        hosts = {}
        for m, split in locals_.items():
            stack.callback(split.stop)
            split.start(None if m.startswith("process") else ["bob"])
            if m.startswith("hosted"):
                hosts[m] = stack.enter_context(hosted_party(load_party_config(split.party_configs["alice"])))
        for rep in range(args.repeat):
            c0 = time.process_time()
            t, mono_err = run_mono()
            monos.append(t)
            cpu_mono.append(time.process_time() - c0)
            for m in modes if rep % 2 == 0 else modes[::-1]:  # (neither mode always runs first after the baseline)
                split = locals_[m]
                cfg = split.split_config(tc, args.seed)
                connect = hosted_connect(hosts[m], cfg) if m in hosts else None
                with SplitDriver(cfg, connect=connect) as drv:
                    drv.open(train=True)  # connection set-up and session opening are not part of a step
                    for n in drv.names:
                        drv.call(n, "restore", 0, {"to_step": 0})
                    pids = [p.proc.pid for p in split.processes.values()]
                    c0 = time.process_time() + sum(_cpu(p) for p in pids)
                    t0 = time.perf_counter()
                    results[m] = drv.train()
                    splits[m].append(time.perf_counter() - t0)
                    cpu_split[m].append(time.process_time() + sum(_cpu(p) for p in pids) - c0)
    mono_s = min(monos)
    print(f"monolithic: {mono_s:.2f}s  ({1000 * mono_s / args.steps:.1f} ms/step)  final error {mono_err:.4f}  "
          f"(runs: {', '.join(f'{t:.2f}' for t in monos)}s; CPU {min(cpu_mono):.2f}s)")
    for m in modes:
        split_s, res = min(splits[m]), results[m]
        where = ("driver in its own process" if m.startswith("process") else
                 "driver hosting alice's party (split train --host)")
        print(f"split, {where}, integrity {arm_of[m]}:")
        print(f"    {split_s:.2f}s  ({1000 * split_s / args.steps:.1f} ms/step)  final error {res.curve[-1][1]:.4f}"
              f"  (runs: {', '.join(f'{t:.2f}' for t in splits[m])}s; CPU of driver + parties "
              f"{min(cpu_split[m]):.2f}s)")
        paired = [t / b for t, b in zip(splits[m], monos, strict=True)]
        print(f"    wall-time ratio split/monolithic (goal <= 1.3x compute-heavy, <= 1.4x default): "
              f"{statistics.median(paired):.3f}x paired (median of the {len(paired)} repetitions' ratios, "
              f"{min(paired):.2f}-{max(paired):.2f}x); {split_s / mono_s:.3f}x fastest runs; "
              f"{statistics.median(splits[m]) / statistics.median(monos):.3f}x medians")
        print(f"    CPU-time ratio {min(cpu_split[m]) / min(cpu_mono):.3f}x")
    if len(arms) == 2:
        for d in drivers:
            on, off = splits[d], splits[f"{d}/off"]
            paired = [a / b for a, b in zip(on, off, strict=True)]
            print(f"integrity default / off, driver {'in its own process' if d == 'process' else 'hosting alice'} "
                  f"(goal <= 1.05x): {statistics.median(paired):.3f}x paired ({min(paired):.2f}-{max(paired):.2f}x); "
                  f"{min(on) / min(off):.3f}x fastest runs; {statistics.median(on) / statistics.median(off):.3f}x "
                  f"medians; CPU {min(cpu_split[d]) / min(cpu_split[f'{d}/off']):.3f}x")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    res = results[modes[0]]
    link = res.links["alice<->bob"]
    wire = link["sent"] + link["received"]
    ctl = sum(v["sent"] + v["received"] for k, v in res.links.items() if k.startswith("driver<->"))
    print(f"alice<->bob wire bytes {wire} vs raw activation+gradient bytes {int(link['raw'])}: "
          f"{wire / link['raw']:.4f}x  (goal <= 1.05x; all runs)")
    print(f"driver<->parties (indices, losses, commits; no tensors) wire bytes {ctl}")


if __name__ == "__main__":
    main()
