"""Compression of the tensors crossing the cut (issue 27): bytes per step, final accuracy, label leakage, in one run.

Part 1, **training over real parties**: the demo's split training (``modelward demo``: digits, CNN channels 16,32
fc 64, alice holds conv1 and the inputs, bob the rest and the labels; SGD 0.02 → 0.002 at step 400, momentum 0.9,
weight decay 1e-4, batch 32, 600 steps, the same initial parameters and data order for every run) over two
``party serve`` processes (gRPC + mutual TLS on 127.0.0.1), with each ``[compression]`` setting applied both ways
(alice's activations forward, bob's gradients back): none, int8 (per-row absmax), top-k 10 %, top-k 1 %. Printed:
the bytes of one training step's request and reply on the alice↔bob link (encoded as the parties encode them,
at the demo's shapes), the measured link bytes per call (every call of the run, the two evaluation passes
included), the final test accuracy, the training time, and the synchronous steps/s of the same parties (restored
to step 0) with every link through a ``ShapingProxy`` (``--wan RTT,Mbit/s``, default 50 ms and 10 Mbit/s: where
bytes cost time).

Part 2, **the label-leakage audit** (``governance.leakage``, in process, the parties' exact step): Li et al.'s norm
and direction attacks score the labels from the gradient Alice decodes, for every compression setting, without
and with Bob's default protection (Marvell, scale 4), on breast cancer (binary: the paper's setting) and digits
(10 classes: the demo's cut); means over the seeds. AUC 0.5 = the gradient reveals nothing.

    python bench/split_compression.py [--steps 600] [--leak-seeds 0,1] [--only train|leakage]
                                      [--wan 50,10] [--wan-steps 30]

Bounded: 4 training runs of ``--steps`` steps (≈ 1 minute at the defaults on a quiet 2-core host) and
2 × 4 × 2 × seeds short in-process audits (≈ 2 minutes).
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
from modelward.governance.leakage.study import load_audit_config, simulate_split
from modelward.governance.party.label_protection import LabelProtectionConfig
from modelward.governance.party.tensors import CompressionConfig, TensorCompression
from modelward.governance.plan import make_plan, segment_of
from modelward.governance.transport.shaping import ShapingProxy
from modelward.governance.wire import Message, encode

ROOT = Path(__file__).resolve().parents[1]
SETTINGS: dict[str, TensorCompression] = {
    "none": TensorCompression(),
    "int8": TensorCompression(method="int8"),
    "topk 10%": TensorCompression(method="topk", ratio=0.10),
    "topk 1%": TensorCompression(method="topk", ratio=0.01),
}


def both_ways(t: TensorCompression) -> CompressionConfig:
    return CompressionConfig(activations=t, gradients=t)


def step_bytes(model: torch.nn.Module, cut: str, batch: int, setting: TensorCompression) -> tuple[int, int]:
    """(request, reply) bytes of one training step on the alice↔bob link, encoded as the parties encode them."""
    alice = segment_of(model, make_plan(model, ["alice", "bob"], [cut]).owners["alice"])
    h = alice(torch.zeros(batch, 1, 8, 8)).detach()
    codec = setting.codec()
    meta = {"anchors": {"alice": [123, "f" * 64]}}
    req = encode(Message("step", "s" * 32, 100, 101, meta, {"h": h, "idx": torch.arange(batch)},
                         {"h": codec} if codec else {}))
    rep = encode(Message("step", "s" * 32, 100, 101, {"loss": 0.1, "anchors": {"bob": [123, "f" * 64]}},
                         {"g": h}, {"g": codec} if codec else {}))
    return len(req), len(rep)


def shaped_rate(split, tc: TrainConfig, rtt_ms: float, bw_mbit: float) -> float:
    """Steps/s of `tc.steps` synchronous steps from step 0 with every link through a :class:`ShapingProxy` (RTT/2
    each way, `bw_mbit` per direction), between the end of the first step and the end of the last."""
    proxies = {n: ShapingProxy(p.address, delay_ms=rtt_ms / 2, rate_mbit=bw_mbit).start()
               for n, p in split.processes.items()}
    try:
        cfg = split.split_config(tc, 0, connect_timeout_s=20.0, timeout_s=120.0)
        cfg.parties = [PartyRef(name=p.name, address=proxies[p.name].address, cert=p.cert) for p in cfg.parties]
        marks: list[float] = []
        with SplitDriver(cfg) as drv:
            drv.open(train=True)
            for n in drv.names:  # from the same state as the full run
                drv.call(n, "restore", 0, {"to_step": 0})
            drv.train(on_step=lambda s, loss, links: marks.append(time.perf_counter()))
        return (len(marks) - 1) / (marks[-1] - marks[0]) if len(marks) > 1 else float("nan")
    finally:
        for px in proxies.values():
            px.stop()


def train_part(steps: int, wan: tuple[float, float] | None = None, wan_steps: int = 30) -> list[dict]:
    data = load_data(DataConfig(source="digits", test_fraction=0.25, seed=0))
    mcfg = ModelConfig(arch="cnn", channels=[16, 32], fc=64)
    tc = TrainConfig(optimizer="sgd", lr=0.02, momentum=0.9, weight_decay=1e-4, batch_size=32, steps=steps,
                     lr_schedule=[[0, 0.02], [min(400, steps * 2 // 3), 0.002]], eval_every=steps, loss="error",
                     eval_batch_size=1024)
    rows = []
    for name, setting in SETTINGS.items():
        model = init_model_(build_model(mcfg, (1, 8, 8), 10), "glorot_uniform", 0)
        req, rep = step_bytes(model, "conv1", tc.batch_size, setting)
        extra = {} if setting.method == "none" else {
            "alice": {"compression": {"activations": setting.model_dump(mode="json")}},
            "bob": {"compression": {"gradients": setting.model_dump(mode="json")}}}
        with tempfile.TemporaryDirectory() as tmp:
            split = prepare_local_split(Path(tmp), model, data, ["alice", "bob"], ["conv1"], threads=1,
                                        checkpoint_every=max(10, steps // 6), extra=extra)
            split.start()
            try:
                t0 = time.perf_counter()
                with SplitDriver(split.split_config(tc, 0, timeout_s=120.0)) as drv:
                    res = drv.train()
                seconds = time.perf_counter() - t0
                rate = float("nan")
                if wan is not None:  # the same parties, restored to step 0, over a shaped network
                    rate = shaped_rate(split, tc.model_copy(update={"steps": wan_steps, "eval_every": wan_steps}),
                                       *wan)
            finally:
                split.stop()
        link = res.links.get("alice<->bob", {})
        calls = max(1, int(link.get("calls", 1)))
        row = {"setting": name, "request": req, "reply": rep, "link_per_call": (link.get("sent", 0)
               + link.get("received", 0)) / calls, "calls": calls, "accuracy": 1.0 - res.curve[-1][1],
               "seconds": seconds, "wan_rate": rate}
        rows.append(row)
        print(f"  {name:9s} step {req + rep:7d} B (request {req}, reply {rep}); link {row['link_per_call']:8.0f} "
              f"B/call over {calls} calls; test accuracy {row['accuracy']:.4f}; {seconds:.1f} s"
              + (f"; {rate:.2f} steps/s at {wan[0]:g} ms RTT, {wan[1]:g} Mbit/s" if wan else ""), flush=True)
    base = rows[0]
    print()
    wan_head = f" steps/s at {wan[0]:g} ms RTT, {wan[1]:g} Mbit/s |" if wan else ""
    print("| compression (both ways) | bytes per step (request + reply) | vs none | measured link B/call | "
          "final test accuracy | Δ accuracy (points) | train s |" + wan_head)
    print("|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if wan else ""))
    for r in rows:
        b = r["request"] + r["reply"]
        print(f"| {r['setting']} | {b:,} | {b / (base['request'] + base['reply']):.3f}× | "
              f"{r['link_per_call']:,.0f} | {r['accuracy']:.4f} | {100 * (r['accuracy'] - base['accuracy']):+.2f} | "
              f"{r['seconds']:.1f} |" + (f" {r['wan_rate']:.2f} ({r['wan_rate'] / base['wan_rate']:.2f}×) |"
                                          if wan else ""))
    return rows


def leakage_part(seeds: list[int]) -> list[dict]:
    rows = []
    for example in ("leakage_breast_cancer.toml", "leakage_digits.toml"):
        cfg = load_audit_config(ROOT / "examples" / example)
        data = load_data(cfg.data)
        counts = torch.bincount(data.y_train, minlength=data.num_classes)
        positive = int(counts.argmin())
        for prot_name, prot in (("none", LabelProtectionConfig()),
                                ("marvell 4", LabelProtectionConfig(method="marvell", scale=4.0))):
            for name, setting in SETTINGS.items():
                t0 = time.perf_counter()
                runs = [simulate_split(data, cfg.model, cfg.cut, cfg.train, prot, s, positive, cfg.audit.init,
                                       both_ways(setting)) for s in seeds]
                row = {"data": data.name, "protection": prot_name, "setting": name,
                       "seconds": time.perf_counter() - t0}
                for k in ("test_accuracy", "norm_auc", "direction_auc", "direction_auc_acc", "direction_accuracy"):
                    vals = [r[k] for r in runs if k in r]
                    if vals:
                        row[k] = statistics.fmean(vals)
                        row[k + "_sd"] = statistics.stdev(vals) if len(vals) > 1 else float("nan")
                rows.append(row)
                print(f"  {data.name:13s} {prot_name:9s} {name:9s} acc {row['test_accuracy']:.4f} "
                      f"norm AUC {row['norm_auc']:.3f} direction AUC {row['direction_auc']:.3f} "
                      f"(accumulated {row['direction_auc_acc']:.3f}) {row['seconds']:.1f} s", flush=True)
    print()
    print(f"Means over seeds {seeds} (± SD over seeds). AUC 0.5 = chance.")
    print()
    print("| data | Bob's protection | compression | test accuracy | norm-attack AUC | direction-attack AUC | "
          "direction AUC, accumulated over epochs |")
    print("|---|---|---|---:|---:|---:|---:|")

    def pm(r: dict, k: str, nd: int = 3) -> str:
        sd = r.get(k + "_sd", float("nan"))
        return f"{r[k]:.{nd}f}" + ("" if sd != sd else f" ± {sd:.{nd}f}")

    for r in rows:
        print(f"| {r['data']} | {r['protection']} | {r['setting']} | {pm(r, 'test_accuracy', 4)} | "
              f"{pm(r, 'norm_auc')} | {pm(r, 'direction_auc')} | {pm(r, 'direction_auc_acc')} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=600, help="training steps per party run (the demo's: 600)")
    ap.add_argument("--leak-seeds", default="0,1", help="seeds of the leakage audit, comma-separated")
    ap.add_argument("--only", choices=["train", "leakage"], default=None)
    ap.add_argument("--wan", default="50,10", help="RTT (ms),bandwidth (Mbit/s) of the shaped-network cell "
                    "(steps/s of the same parties through ShapingProxy); 'none' skips it")
    ap.add_argument("--wan-steps", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    if args.only != "leakage":
        print(f"Part 1: the demo's split training over two party processes, {args.steps} steps, compression both "
              "ways")
        wan = None if args.wan == "none" else tuple(float(v) for v in args.wan.split(","))
        train_part(args.steps, wan, args.wan_steps)
        print()
    if args.only != "train":
        print("Part 2: label-leakage audit (in process) against the gradient Alice decodes")
        leakage_part([int(s) for s in args.leak_seeds.split(",")])
    print(f"\ntotal {time.perf_counter() - t0:.0f} s; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
