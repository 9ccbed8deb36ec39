"""CPU time per split training step of an in-process chain (no sockets, no TLS): what the protocol itself costs.

Alice | Bob in one process, connected through ``InProcessClient``: the same state machine, gate, wire bytes, consent
checks, audit log, tentative step and two-phase commit as over gRPC, without the transport. Far less sensitive to a
loaded host than the wall time of ``bench/split_overhead.py`` (it measures the process's CPU time), so it is the
one to compare two versions of the party code with, in alternation. The printed digest of Bob's final state must
be the same for two versions that compute the same thing.

    python bench/split_inprocess.py [--steps 41] [--channels 64,128] [--fc 256] [--batch 128] [--integrity off|default]

``--integrity default`` gives both parties the shipped ``[integrity]`` (bounded steps, the trend detector; the
harness's default is the exact comparison, bounds off): alternate it with ``off`` to measure what the poisoning
defence costs per step (issue 36).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from modelward.core.data import DataConfig, load_data
from modelward.core.init import init_model_
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig, build_model
from modelward.governance.demo import prepare_local_split
from modelward.governance.driver import PartyRef, SplitConfig, SplitDriver
from modelward.governance.party.config import load_party_config
from modelward.governance.party.machine import Party
from modelward.governance.transport.client import InProcessClient


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=41)
    ap.add_argument("--channels", default="64,128")
    ap.add_argument("--fc", type=int, default=256)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--integrity", choices=["off", "default"], default="off",
                    help="the parties' [integrity]: off (the exact harness) or the shipped defaults")
    args = ap.parse_args()
    torch.set_num_threads(1)
    data = load_data(DataConfig(source="digits", seed=0))
    mcfg = ModelConfig(arch="cnn", channels=[int(c) for c in args.channels.split(",")], fc=args.fc)
    model = init_model_(build_model(mcfg, (1, 8, 8), 10), seed=0)
    names = ["alice", "bob"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        extra = {n: {"integrity": {}} for n in names} if args.integrity == "default" else None
        split = prepare_local_split(root, model, data, names, ["conv1"], checkpoint_every=10, extra=extra)
        parties: dict[str, Party] = {}
        for n in reversed(names):
            p = Party(load_party_config(split.party_configs[n]),
                      connect=lambda name, addr, me=n: InProcessClient(parties[name], caller=me))
            p.next_address = "in-process" if p.cfg.next else None
            parties[n] = p
        tc = TrainConfig(steps=args.steps, eval_every=args.steps, batch_size=args.batch, lr=0.05)
        cfg = SplitConfig(parties=[PartyRef(name=n, address="in-process") for n in names], tls=split.tls,
                          train=tc, out_dir=str(root / "driver"))
        driver = Path(split.tls.cert).stem
        gen = torch.Generator().manual_seed(0)
        batches = [torch.randint(0, len(data.x_train), (args.batch,), generator=gen) for _ in range(args.steps)]
        with SplitDriver(cfg, connect=lambda ref, c: InProcessClient(parties[ref.name], driver)) as drv:
            drv.open(train=True)
            drv.train_step(0, batches[0])  # (warm: the first step pays one-time set-up)
            cpu, wall = time.process_time(), time.perf_counter()
            for s in range(1, args.steps):
                drv.train_step(s, batches[s], lazy=True)
            drv.flush()
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        n = args.steps - 1
        print(f"in-process split step: CPU {1000 * cpu / n:.2f} ms, wall {1000 * wall / n:.2f} ms per step "
              f"({n} steps, cnn {mcfg.channels} fc {mcfg.fc}, batch {args.batch}); bob's state digest "
              f"{parties['bob'].state_digest()[:16]}")
        for p in parties.values():
            p.close()


if __name__ == "__main__":
    main()
