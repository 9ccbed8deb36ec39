"""False refusals and halts of honest split training (issue 36 item 3): long honest runs through the parties' real
state machines under the shipped defaults, counted from the parties' own audit logs.

Each job trains one split from a seeded initialisation for ``--steps`` steps: two ``Party`` objects (the state
machine the ``party serve`` processes run: gate, consent, audit, tentative step, label protection, integrity)
joined by in-process clients (the same encoded messages, without sockets), driven by ``SplitDriver`` in one of
three modes: ``sync`` (one step at a time), ``pipelined`` (step s+1 sent before step s is answered, as over the
network) and ``stale1`` (bounded staleness 1: alice keeps two steps in flight). Configurations: ``digits`` (the
demo: CNN 16-32 fc 64, alice holds conv1; SGD 0.05, momentum 0.9, weight decay 1e-4, batch 64 as in
examples/split_digits.toml) and ``breast_cancer`` (examples/leakage_breast_cancer.toml: MLP 64-32, alice holds fc1;
SGD 0.01, momentum 0.9, batch 32). Bob keeps his defaults: label protection (Marvell, scale 4) and ``[integrity]``.

A refusal is any training step a party refused or rolled back (audit records of op ``step`` with decision
``error`` or ``deny``), a halt is the trend detector's (op ``halt``). A halted job is resumed the way the docs say
(``integrity.resume`` = ``modelward party resume``) and trained on to its end, so every job covers all its steps.
Also written per job: how often each bound of ``governance.bounded_influence`` bound (rows clipped, steps capped,
running statistics bounded), the largest CUSUM value seen, and the final test accuracy.

    nice -n 10 python bench/split_false_refusals.py [--configs digits,breast_cancer] [--modes sync,pipelined,stale1]
        [--seeds 10] [--steps 5000] [--out runs/bench/false_refusals]

Resumable: a job's result is ``<out>/<config>/<mode>/seed<k>/result.json``; a finished job is skipped, an
interrupted one resumes from its parties' checkpoints (their audit logs keep the counts). ``--summary-only`` runs
nothing: it summarises the finished jobs and lists the unfinished ones with the steps their label holder has
checkpointed and the refusals and halts in their audit logs so far (what a run stopped at a deadline covered). Progress goes to the
log (``MODELWARD_PROGRESS_SECONDS``), one line per job as it finishes, and the summary to ``<out>/summary.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sqlite3
import time
import tomllib
from pathlib import Path
from typing import Any

import torch

from modelward.core.data import DataConfig, load_data
from modelward.core.init import init_model_
from modelward.core.io import load_metadata
from modelward.core.progress import RichProgress
from modelward.core.records import atomic_write_json
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ModelwardError
from modelward.governance.demo import prepare_local_split
from modelward.governance.driver import PartyRef, SplitConfig, SplitDriver
from modelward.governance.integrity import read_halt, resume
from modelward.governance.party.config import load_party_config
from modelward.governance.party.machine import Party
from modelward.governance.transport.client import InProcessClient

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("split_false_refusals")
MODES = {"sync": (False, 0), "pipelined": (True, 0), "stale1": (True, 1)}


def configs() -> dict[str, dict[str, Any]]:
    """The two splits, read from the shipped examples."""
    split = tomllib.loads((ROOT / "examples/split_digits.toml").read_text())["train"]
    leak = tomllib.loads((ROOT / "examples/leakage_breast_cancer.toml").read_text())
    return {
        "digits": {"data": DataConfig(source="digits", seed=0),
                   "model": ModelConfig(arch="cnn", channels=[16, 32], fc=64), "cut": "conv1",
                   "train": {k: v for k, v in split.items() if k not in ("steps", "eval_every", "loss")}},
        "breast_cancer": {"data": DataConfig(**leak["data"]), "model": ModelConfig(**leak["model"]),
                          "cut": leak["cut"],
                          "train": {k: v for k, v in leak["train"].items() if k not in ("steps",)}},
    }


class InProcessSplit:
    """Two parties joined in process (as tests/governance/conftest.py's Chain), rebuilt over the same folder to
    resume."""

    def __init__(self, folder: Path, cfg: dict[str, Any], seed: int) -> None:
        self.folder = folder
        data = load_data(cfg["data"])
        self.data = data
        model = init_model_(build_model(cfg["model"], data.input_shape, data.num_classes), "glorot_uniform", seed)
        # shipped defaults for the parties (exact=False: label protection, integrity); the harness's permissive
        # policy lets its driver (alice's identity) evaluate
        self.split = prepare_local_split(folder, model, data, ["alice", "bob"], [cfg["cut"]], threads=1,
                                         exact=False)
        self.parties: dict[str, Party] = {}
        for n in ("bob", "alice"):
            p = Party(load_party_config(self.split.party_configs[n]),
                      connect=lambda name, addr, me=n: InProcessClient(self.parties[name], caller=me))
            p.next_address = "in-process" if p.cfg.next else None
            self.parties[n] = p

    def driver(self, tc: TrainConfig, seed: int, pipeline: bool, staleness: int) -> SplitDriver:
        cfg = SplitConfig(parties=[PartyRef(name=n, address="in-process") for n in ("alice", "bob")],
                          tls=self.split.tls, train=tc, seed=seed, out_dir=str(self.folder / "driver"))
        return SplitDriver(cfg, None, connect=lambda ref, c: InProcessClient(self.parties[ref.name], "alice"),
                           pipeline=pipeline, staleness=staleness)

    def close(self) -> None:
        for p in self.parties.values():
            p.close()


def audit_counts(db: Path) -> dict[str, Any]:
    con = sqlite3.connect(db)
    try:
        refused = con.execute("SELECT step, decision, reason FROM audit WHERE op='step' AND decision IN "
                              "('error','deny') ORDER BY id").fetchall()
        halts = con.execute("SELECT step, reason FROM audit WHERE op='halt' ORDER BY id").fetchall()
    finally:
        con.close()
    return {"refused": len(refused), "halts": len(halts),
            "first_reasons": [r[2][:300] for r in refused[:3]] + [h[1][:300] for h in halts[:3]]}


def integrity_state(ckpt_dir: Path) -> dict[str, Any]:
    steps = sorted(ckpt_dir.glob("step_*.safetensors"))
    if not steps:
        return {}
    meta = json.loads(load_metadata(steps[-1]).get("modelward", "{}"))
    return meta.get("integrity", {})


def run_job(folder: Path, cfg: dict[str, Any], mode: str, seed: int, steps: int, progress: RichProgress) -> dict:
    pipeline, staleness = MODES[mode]
    tc = TrainConfig(**cfg["train"], steps=steps, eval_every=max(1, steps // 5), loss="error")
    t0 = time.perf_counter()
    events: list[str] = []
    result = None
    while True:
        split = InProcessSplit(folder, cfg, seed)
        try:
            bob_dir = Path(split.parties["bob"].cfg.checkpoint_dir)
            with split.driver(tc, seed, pipeline, staleness) as drv:
                result = drv.train(progress, folder / "driver")
            break
        except ModelwardError as e:
            events.append(f"{type(e).__name__}: {str(e)[:300]}")
            log.warning("%s: %s", folder, events[-1])
            if read_halt(bob_dir) is not None:
                resume(bob_dir)  # what the docs tell bob's operator to do (`modelward party resume`)
            if len(events) > 20:
                raise
        finally:
            split.close()
    out: dict[str, Any] = {"config": folder.parent.parent.name, "mode": mode, "seed": seed, "steps": steps,
                           "seconds": round(time.perf_counter() - t0, 1), "events": events,
                           "test_error": result.curve[-1][1] if result else None}
    for n in ("alice", "bob"):
        out[n] = {**audit_counts(folder / n / "audit.db"), "integrity": integrity_state(folder / n / "checkpoints")}
    return out


def partial_job(folder: Path, config: str, mode: str, seed: int) -> dict[str, Any]:
    """An unfinished job: the steps its label holder has checkpointed (a lower bound of the steps run) and the
    refusals and halts its parties' audit logs hold so far."""
    ckpts = sorted((folder / "bob" / "checkpoints").glob("step_*.safetensors"))
    steps = int(ckpts[-1].stem.split("_")[1]) if ckpts else 0
    counts = {n: audit_counts(folder / n / "audit.db") for n in ("alice", "bob") if (folder / n / "audit.db").is_file()}
    return {"config": config, "mode": mode, "seed": seed, "steps": steps,
            "refusals": sum(c["refused"] for c in counts.values()), "halts": sum(c["halts"] for c in counts.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="digits,breast_cancer")
    ap.add_argument("--modes", default="sync,pipelined,stale1")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--out", default=str(ROOT / "runs/bench/false_refusals"))
    ap.add_argument("--summary-only", action="store_true", help="run nothing; summarise what is there")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(1)
    out = Path(args.out)
    cfgs = configs()
    jobs = [(c, m, s) for c in args.configs.split(",") for m in args.modes.split(",")
            for s in range(args.first_seed, args.first_seed + args.seeds)]
    progress = RichProgress()
    progress.start("jobs", len(jobs), "false refusals: jobs")
    results, partial = [], []
    for c, m, s in jobs:
        folder = out / c / m / f"seed{s}"
        done = folder / "result.json"
        if args.summary_only and not done.is_file():
            if (folder / "bob" / "audit.db").is_file():
                partial.append(partial_job(folder, c, m, s))
            continue
        if not done.is_file():
            atomic_write_json(done, run_job(folder, cfgs[c], m, s, args.steps, progress))
        r = json.loads(done.read_text())
        results.append(r)
        line = (f"{c} {m} seed {s}: refused alice {r['alice']['refused']} bob {r['bob']['refused']}, halts "
                f"{r['bob']['halts']}, test error {r['test_error']}, {r['seconds']} s")
        log.info(line)
        progress.advance("jobs", 1, line)
    progress.done("jobs")
    summary: dict[str, Any] = {}
    for r in results:
        key = f"{r['config']}/{r['mode']}"
        s = summary.setdefault(key, {"jobs": 0, "steps": 0, "refusals": 0, "halts": 0, "rows": 0,
                                     "rows_clipped": 0, "bob_steps_capped": 0, "alice_steps_capped": 0,
                                     "buffers_bounded": 0, "max_cusum": 0.0, "test_error": []})
        s["jobs"] += 1
        s["steps"] += r["steps"]
        s["refusals"] += r["alice"]["refused"] + r["bob"]["refused"]
        s["halts"] += r["bob"]["halts"]
        bi = r["bob"].get("integrity", {}).get("influence", {}).get("counts", {})
        ai = r["alice"].get("integrity", {}).get("influence", {}).get("counts", {})
        s["rows"] += bi.get("rows", 0)
        s["rows_clipped"] += bi.get("rows_clipped", 0)
        s["bob_steps_capped"] += bi.get("steps_capped", 0)
        s["alice_steps_capped"] += ai.get("steps_capped", 0)
        s["buffers_bounded"] += bi.get("buffers_bounded", 0)
        s["max_cusum"] = max(s["max_cusum"], float(r["bob"].get("integrity", {}).get("trend", {}).get("max_S", 0)))
        s["test_error"].append(r["test_error"])
    total = {"steps": sum(s["steps"] for s in summary.values()),
             "refusals": sum(s["refusals"] for s in summary.values()),
             "halts": sum(s["halts"] for s in summary.values())}
    unfinished = {"jobs": len(partial), "steps": sum(p["steps"] for p in partial),
                  "refusals": sum(p["refusals"] for p in partial), "halts": sum(p["halts"] for p in partial)}
    atomic_write_json(out / ("summary_so_far.json" if args.summary_only else "summary.json"),
                      {"by_config_mode": summary, "total": total, "unfinished": partial})
    print(f"{'config/mode':28s} {'jobs':>4s} {'steps':>7s} {'refused':>7s} {'halts':>5s} {'rows clipped':>13s} "
          f"{'caps b/a':>9s} {'bn bounded':>10s} {'max S':>6s} {'test error (mean)':>17s}")
    for k, s in summary.items():
        errs = [e for e in s["test_error"] if e is not None]
        print(f"{k:28s} {s['jobs']:4d} {s['steps']:7d} {s['refusals']:7d} {s['halts']:5d} "
              f"{s['rows_clipped'] / max(1, s['rows']):13.4f} {s['bob_steps_capped']:4d}/{s['alice_steps_capped']:<4d} "
              f"{s['buffers_bounded']:10d} {s['max_cusum']:6.2f} {sum(errs) / max(1, len(errs)):17.4f}")
    print(f"total: {total['refusals']} refusals and {total['halts']} halts in {total['steps']} honest steps")
    for p in partial:
        print(f"unfinished: {p['config']} {p['mode']} seed {p['seed']}: {p['steps']} steps checkpointed, "
              f"{p['refusals']} refused, {p['halts']} halts")
    if partial:
        print(f"with the unfinished jobs: {total['refusals'] + unfinished['refusals']} refusals and "
              f"{total['halts'] + unfinished['halts']} halts in {total['steps'] + unfinished['steps']} honest steps")


if __name__ == "__main__":
    main()
