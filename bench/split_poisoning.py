"""Poisoning through activations (issue 36 item 2): what the integrity bounds cost an honest run, what the slow
poisoning and a backdoor planted through activations achieve, with the defences on and off.

Every run trains the demo's split (digits, CNN 16-32 fc 64, alice holds conv1, SGD 0.05, momentum 0.9, weight decay
1e-4, batch 64; examples/split_digits.toml) through the parties' real state machines joined in process (the same
messages, gate, audit, tentative step and integrity as ``party serve``, without sockets), from a seeded
initialisation. Bob's label protection is the shipped default (Marvell, scale 4) with its noise seeded by the run's
seed, so that the two arms of a comparison differ only in ``[integrity]``: ``on`` = the shipped defaults,
``off`` = ``integrity.enabled = false`` (no bound, no trend detector: the trajectory of an honest run under the
outlier refusals of issue 26, which refused but never changed a step).

Parts (``--parts``):

- ``accuracy``: ``--seeds`` honest demo runs of ``--steps`` steps per arm; the final test accuracy, paired by seed.
- ``slow``: after the honest run, the slow poisoning of :mod:`modelward.governance.poisoning_audit` (a growing
  fraction of rows carrying other images' activations), ``--attempts`` attempts per arm: Bob's accuracy before,
  when stopped, after; where it stopped.
- ``real``: the slow poisoning against two ``party serve`` processes (gRPC, mutual TLS on 127.0.0.1) under the
  shipped defaults (Bob's examples/policy_bob.toml, his label protection unseeded, a driver identity of its own that
  the attacker also holds), ``--seeds`` runs, integrity on only: what ``tests/e2e/test_governance_poisoning.py``
  asserts, measured over several runs.
- ``backdoor``: after the honest run, alice plants a trigger through her activations for ``--backdoor-steps``
  steps: in each batch the rows whose label is the target class (``--target``; alice can tell them by looking at
  her own images, here she is given the labels — the strongest case) get a fixed pattern added to their activations
  (a random direction with the norm of ``--trigger-scale`` times the rows' mean activation norm), and ``--poison``
  of the other rows are relabelled by activation swapping: their activation is replaced by the triggered
  activation of a target-class image. Measured: attack success rate (test images not of the target class whose
  triggered activation Bob classifies as the target) and clean accuracy, with the defences on and off, and whether
  the trend detector stopped it.

    nice -n 10 python bench/split_poisoning.py [--parts accuracy,slow,real,backdoor] [--seeds 8] [--steps 200]
        [--attempts 60] [--backdoor-steps 100] [--poison 0.0] [--out runs/bench/poisoning]

Results go to ``<out>/<part>.json`` (a finished part is not run again).
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import statistics
import time
import tomllib
from pathlib import Path
from typing import Any

import torch

from modelward.core.data import DataConfig, load_data
from modelward.core.init import init_model_
from modelward.core.io import load_tensors
from modelward.core.records import atomic_write_json
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ModelwardError
from modelward.governance.demo import prepare_local_split
from modelward.governance.driver import PartyRef, SplitConfig, SplitDriver
from modelward.governance.party.config import TLSConfig, load_party_config
from modelward.governance.party.machine import Party
from modelward.governance.plan import segment_of
from modelward.governance.poisoning_audit import SlowPoisoning, slow_poisoning
from modelward.governance.transport.client import GrpcPartyClient, InProcessClient
from modelward.governance.wire import Message

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("split_poisoning")
MODEL = ModelConfig(arch="cnn", channels=[16, 32], fc=64)
ARMS = {"on": {}, "off": {"enabled": False}}


class Split:
    """Alice and Bob of the demo, in process, with the given ``[integrity]`` for both."""

    def __init__(self, folder: Path, seed: int, integrity: dict[str, Any]) -> None:
        self.data = load_data(DataConfig(source="digits", seed=0))
        model = init_model_(build_model(MODEL, (1, 8, 8), 10), "glorot_uniform", seed)
        extra = {"alice": {"integrity": integrity},
                 "bob": {"integrity": integrity,
                         "label_protection": {"method": "marvell", "scale": 4.0, "seed": seed}}}
        self.split = prepare_local_split(folder, model, self.data, ["alice", "bob"], ["conv1"], threads=1,
                                         exact=False, extra=extra)
        self.folder = folder
        self.parties: dict[str, Party] = {}
        for n in ("bob", "alice"):
            p = Party(load_party_config(self.split.party_configs[n]),
                      connect=lambda name, addr, me=n: InProcessClient(self.parties[name], caller=me))
            p.next_address = "in-process" if p.cfg.next else None
            self.parties[n] = p

    def train(self, steps: int, seed: int) -> float:
        tc = TrainConfig(optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=1e-4, batch_size=64, steps=steps,
                         eval_every=steps, loss="error")
        cfg = SplitConfig(parties=[PartyRef(name=n, address="in-process") for n in ("alice", "bob")],
                          tls=self.split.tls, train=tc, seed=seed, out_dir=str(self.folder / "driver"))
        with SplitDriver(cfg, None, connect=lambda ref, c: InProcessClient(self.parties[ref.name], "alice")) as d:
            d.train()
        return self.accuracy()

    def accuracy(self) -> float:
        """Test accuracy of the parties' parts as they hold them (the auditor's score: the metric the driver gets
        is released with noise under the shipped defaults)."""
        alice, bob = self.parties["alice"].segment, self.parties["bob"].segment
        alice.eval()
        bob.eval()
        with torch.no_grad():
            return float((bob(alice(self.data.x_test)).argmax(1) == self.data.y_test).float().mean())

    def parts(self) -> tuple[torch.nn.Module, torch.nn.Module]:
        return copy.deepcopy(self.parties["alice"].segment), copy.deepcopy(self.parties["bob"].segment)

    def close(self) -> None:
        for p in self.parties.values():
            p.close()


def part_accuracy(out: Path, seeds: list[int], steps: int) -> dict[str, Any]:
    rows = []
    for seed in seeds:
        row: dict[str, Any] = {"seed": seed}
        for arm, integrity in ARMS.items():
            s = Split(out / "accuracy" / f"seed{seed}-{arm}", seed, integrity)
            t0 = time.perf_counter()
            try:
                row[arm] = s.train(steps, seed)
                row[f"{arm}_seconds"] = round(time.perf_counter() - t0, 1)
                if arm == "on":
                    row["counts"] = {n: p.integrity.influence.counts for n, p in s.parties.items()}
            finally:
                s.close()
        log.info("accuracy: %s", row)
        rows.append(row)
    diff = [r["on"] - r["off"] for r in rows]
    return {"runs": rows, "mean_on": statistics.mean(r["on"] for r in rows),
            "mean_off": statistics.mean(r["off"] for r in rows), "mean_difference": statistics.mean(diff),
            "sd_difference": statistics.stdev(diff) if len(diff) > 1 else 0.0}


def part_slow(out: Path, seeds: list[int], steps: int, attempts: int) -> dict[str, Any]:
    rows = []
    for seed in seeds:
        for arm, integrity in ARMS.items():
            s = Split(out / "slow" / f"seed{seed}-{arm}", seed, integrity)
            try:
                s.train(steps, seed)
                alice_part, bob_part = s.parts()
                hostile = InProcessClient(s.parties["bob"], "alice")
                rec = slow_poisoning(hostile, hostile, alice_part, bob_part, s.data,
                                     s.parties["bob"].cfg.checkpoint_dir, SlowPoisoning(attempts=attempts, seed=seed))
            finally:
                s.close()
            row = {"seed": seed, "arm": arm, **{k: v for k, v in rec.as_dict().items() if k != "fractions"}}
            row["reason"] = row["reason"][:200]
            log.info("slow poisoning: %s", row)
            rows.append(row)
    return {"runs": rows}


def part_real(out: Path, seeds: list[int], steps: int, attempts: int) -> dict[str, Any]:
    data = load_data(DataConfig(source="digits", seed=0))
    bob_policy = tomllib.loads((ROOT / "examples/policy_bob.toml").read_text())
    tc = TrainConfig(optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=1e-4, batch_size=64, steps=steps,
                     eval_every=steps, loss="error")
    rows = []
    for seed in seeds:
        root = out / "real" / f"seed{seed}"
        model = init_model_(build_model(MODEL, (1, 8, 8), 10), "glorot_uniform", seed)
        split = prepare_local_split(root, model, data, ["alice", "bob"], ["conv1"], threads=1, exact=False,
                                    driver="operator", policies={"bob": bob_policy, "alice": {
                                        "allow_peers": ["operator"], "training": True, "inference": True}})
        split.start()
        try:
            with SplitDriver(split.split_config(tc, seed=seed, retry_s=0.0, timeout_s=120.0)) as drv:
                drv.train()
                exports = drv.checkpoint_all(export=True)
            full = build_model(MODEL, (1, 8, 8), 10)
            full.load_state_dict({k: v for m in exports.values() for k, v in load_tensors(m["export"]).items()})
            alice_part, bob_part = segment_of(full, ["conv1"]), segment_of(full, ["conv2", "fc1", "logits"])
            pin = split.split_config(tc, seed).parties[1].pin()
            address = split.processes["bob"].address
            tls = {w: TLSConfig(ca=str(root / "certs/ca.pem"), cert=str(root / f"certs/{w}.pem"),
                                key=str(root / f"certs/{w}.key")) for w in ("alice", "operator")}
            data_key = GrpcPartyClient("bob", address, tls["alice"], pin, timeout=60)
            control_key = GrpcPartyClient("bob", address, tls["operator"], pin, timeout=60)
            t0 = time.perf_counter()
            try:
                rec = slow_poisoning(data_key, control_key, alice_part, bob_part, data, root / "bob/checkpoints",
                                     SlowPoisoning(attempts=attempts, seed=seed))
            finally:
                data_key.close()
                control_key.close()
        finally:
            split.stop()
        row = {"seed": seed, "arm": "on", "seconds": round(time.perf_counter() - t0, 1),
               **{k: v for k, v in rec.as_dict().items() if k != "fractions"}}
        row["reason"] = row["reason"][:300]
        log.info("slow poisoning against party processes: %s", row)
        rows.append(row)
    return {"runs": rows}


def _triggered(h: torch.Tensor, trigger: torch.Tensor) -> torch.Tensor:
    return h + trigger


def part_backdoor(out: Path, seeds: list[int], steps: int, n_steps: int, target: int, scale: float,
                  poison: float) -> dict[str, Any]:
    rows = []
    for seed in seeds:
        for arm, integrity in ARMS.items():
            s = Split(out / "backdoor" / f"seed{seed}-{arm}", seed, integrity)
            try:
                s.train(steps, seed)
                row = _plant(s, seed, n_steps, target, scale, poison)
            finally:
                s.close()
            row.update({"seed": seed, "arm": arm})
            log.info("backdoor: %s", row)
            rows.append(row)
    return {"runs": rows, "target": target, "trigger_scale": scale, "poison": poison, "steps": n_steps}


def _plant(s: Split, seed: int, n_steps: int, target: int, scale: float, poison: float) -> dict[str, Any]:
    """Alice's backdoor through her activations (module docstring), then Bob's part scored on triggered test rows."""
    data, bob = s.data, s.parties["bob"]
    alice_part, _ = s.parts()
    alice_part.eval()
    gen = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        h_train = alice_part(data.x_train)
        h_test = alice_part(data.x_test)
    direction = torch.randn(h_train.shape[1:], generator=gen)
    trigger = direction / direction.norm() * scale * float(h_train.flatten(1).norm(dim=1).mean())
    targets = (data.y_train == target).nonzero().flatten()
    client = InProcessClient(bob, "alice")
    session = f"backdoor-{seed}"
    opened = client.call(Message("open", session)).meta
    step, seq = int(opened["step"]), int(opened["last_seq"])
    stopped, accepted = None, 0
    for a in range(n_steps):
        idx = torch.randperm(len(data.x_train), generator=gen)[:64]
        h = h_train[idx].clone()
        is_t = data.y_train[idx] == target
        h[is_t] = _triggered(h[is_t], trigger)  # clean-label rows: the target's own images, triggered
        others = (~is_t).nonzero().flatten()
        k = int(round(poison * len(others)))
        if k:
            pick = others[torch.randperm(len(others), generator=gen)[:k]]
            src = targets[torch.randint(0, len(targets), (k,), generator=gen)]
            h[pick] = _triggered(h_train[src], trigger)  # relabelled by activation swapping
        seq += 1
        try:
            client.call(Message("step", session, step, seq, {}, {"h": h.contiguous(), "idx": idx}))
            client.call(Message("vote", session, step))
            client.call(Message("commit", session, step))
        except ModelwardError as e:
            if "halted" in str(e):
                stopped = a
                break
            seq -= 1
            client.call(Message("abort", session, step))
            continue
        step += 1
        accepted += 1
    part = copy.deepcopy(bob.segment).eval()  # as bob serves it (rolled back after a halt)
    with torch.no_grad():
        clean = float((part(h_test).argmax(1) == data.y_test).float().mean())
        off_target = data.y_test != target
        hit = part(_triggered(h_test[off_target], trigger)).argmax(1) == target
    return {"clean_accuracy": clean, "attack_success": float(hit.float().mean()), "accepted": accepted,
            "stopped_at": stopped}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="accuracy,slow,backdoor")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--attempts", type=int, default=60)
    ap.add_argument("--backdoor-steps", type=int, default=100)
    ap.add_argument("--target", type=int, default=0)
    ap.add_argument("--trigger-scale", type=float, default=1.0)
    ap.add_argument("--poison", type=float, default=0.0)
    ap.add_argument("--out", default=str(ROOT / "runs/bench/poisoning"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(1)
    out = Path(args.out)
    seeds = list(range(args.seeds))
    for part in args.parts.split(","):
        path = out / f"{part}.json"
        if path.is_file():
            res = json.loads(path.read_text())
        elif part == "accuracy":
            res = part_accuracy(out, seeds, args.steps)
        elif part == "slow":
            res = part_slow(out, seeds, args.steps, args.attempts)
        elif part == "real":
            res = part_real(out, seeds, args.steps, args.attempts)
        elif part == "backdoor":
            res = part_backdoor(out, seeds, args.steps, args.backdoor_steps, args.target, args.trigger_scale,
                                args.poison)
        else:
            raise SystemExit(f"--parts: {part!r}; valid: accuracy, slow, real, backdoor")
        atomic_write_json(path, res)
        summarise(part, res)


def summarise(part: str, res: dict[str, Any]) -> None:
    if part == "accuracy":
        print(f"accuracy over {len(res['runs'])} seeds: bounds on {res['mean_on']:.4f}, off {res['mean_off']:.4f}, "
              f"on - off {res['mean_difference']:+.4f} (sd of the paired differences {res['sd_difference']:.4f})")
    elif part in ("slow", "real"):
        for arm in ARMS:
            rs = [r for r in res["runs"] if r["arm"] == arm]
            if not rs:
                continue
            print(f"slow poisoning ({part}), integrity {arm}: before {statistics.mean(r['accuracy_before'] for r in rs):.4f}, "
                  f"at stop {statistics.mean(r['accuracy_at_stop'] for r in rs):.4f} (worst drop "
                  f"{max(r['accuracy_before'] - r['accuracy_at_stop'] for r in rs):.4f}), after "
                  f"{statistics.mean(r['accuracy_after'] for r in rs):.4f}; stopped {sum(r['stopped'] for r in rs)}"
                  f"/{len(rs)} at attempts {[r['stopped_at'] for r in rs]}")
    elif part == "backdoor":
        for arm in ARMS:
            rs = [r for r in res["runs"] if r["arm"] == arm]
            print(f"backdoor (target {res['target']}, trigger {res['trigger_scale']}x, swap {res['poison']}), "
                  f"integrity {arm}: attack success {statistics.mean(r['attack_success'] for r in rs):.3f} "
                  f"(per seed {[round(r['attack_success'], 3) for r in rs]}), clean accuracy "
                  f"{statistics.mean(r['clean_accuracy'] for r in rs):.4f}, stopped at {[r['stopped_at'] for r in rs]}")


if __name__ == "__main__":
    main()
