"""A backdoor planted by one party through its activations in split training (issue 41 item 7): does the
model-level detector find it after training?

    nice -n 10 .venv/bin/python bench/backdoor_split.py [--seeds 5] [--steps 200] [--backdoor-steps 100]
        [--poison 0.2] [--trigger-scale 1.0] [--out runs/bench/backdoor_split]

Every run trains the demo's split (digits, CNN 16–32 fc 64, alice holds conv1, bob the rest and the labels;
examples/split_digits.toml) through the parties' real state machines joined in process (the same messages, gate,
audit, tentative step and integrity checks as ``party serve``, without sockets; the parties' shipped defaults),
``--steps`` honest steps from a seeded initialisation. Then alice drives ``--backdoor-steps`` more steps herself,
sending bob activations of her frozen part (the attack of gov-poison's ``bench/split_poisoning.py``, issue 36):

- ``backdoored``: in each batch the rows of the target class (``seed mod 10``; alice is given the labels, the
  strongest case) get a fixed pattern added to their activations (a random direction with ``--trigger-scale`` times
  the rows' mean activation norm), and ``--poison`` of the other rows are replaced by the triggered activation of a
  target-class image (activation swapping, which relabels them);
- ``clean``: the same steps with the rows' own activations (the control: same path, no trigger).

The parties' ``[integrity]`` is on (the shipped defaults; the figures in docs/backdoor.md were measured with the
outlier refusals of issue 26, since replaced by bounded influence and the trend detector) or off: with it on, the
planted steps were refused and the backdoor did not land; the detection question is asked of the backdoor that lands (integrity off), against
clean runs under the same settings. Arms: backdoored/on, backdoored/off, clean/off.

Measured, per run: the backdoor's attack success (held-out images not of the target whose triggered activation bob
classifies as the target) and clean accuracy; then the detectors on what the parties hold after training —

- on the assembled model (alice's segment then bob's), in input space, as a model owner would run them: Neural
  Cleanse (on 200 held-out images) and MM-BD;
- on the assembled model, the BatchNorm shift (sixth round) on the same 200 held-out images: bob's BatchNorm layer
  averaged the activations alice sent, planted rows included;
- on bob's segment alone, in activation space (bob, the label holder, auditing his own part; the box is [0, the
  largest activation seen]): MM-BD, which needs no data and no trigger shape.

Results go to ``<out>/runs.json`` (resumable: finished runs are kept) and a summary is printed.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from modelward.backdoor.detect.model.bn_shift import BatchNormShift
from modelward.backdoor.detect.model.mmbd import MMBD
from modelward.backdoor.detect.model.neural_cleanse import NeuralCleanse
from modelward.backdoor.experiment import defender_split
from modelward.core.data import DataConfig, load_data
from modelward.core.init import init_model_
from modelward.core.records import atomic_write_json
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ModelwardError
from modelward.governance.demo import prepare_local_split
from modelward.governance.driver import PartyRef, SplitConfig, SplitDriver
from modelward.governance.party.config import load_party_config
from modelward.governance.party.machine import Party
from modelward.governance.transport.client import InProcessClient
from modelward.governance.wire import Message

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("backdoor_split")
MODEL = ModelConfig(arch="cnn", channels=[16, 32], fc=64)


class Split:
    """Alice (conv1) and Bob (the rest, the labels) of the demo, in process, under their shipped defaults."""

    def __init__(self, folder: Path, seed: int, integrity: bool = True) -> None:
        self.data = load_data(DataConfig(source="digits", seed=0))
        model = init_model_(build_model(MODEL, (1, 8, 8), 10), "glorot_uniform", seed)
        extra = {} if integrity else {n: {"integrity": {"enabled": False}} for n in ("alice", "bob")}
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
            return 1.0 - d.train().curve[-1][1]

    def segments(self) -> tuple[nn.Module, nn.Module]:
        return (copy.deepcopy(self.parties["alice"].segment).eval(),
                copy.deepcopy(self.parties["bob"].segment).eval())

    def close(self) -> None:
        for p in self.parties.values():
            p.close()


def drive(s: Split, seed: int, n_steps: int, target: int, scale: float, poison: float, plant: bool
          ) -> dict[str, Any]:
    """Alice's ``n_steps`` steps through her activations (triggered rows when ``plant``), then the effect."""
    data, bob = s.data, s.parties["bob"]
    alice_part, _ = s.segments()
    gen = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        h_train = alice_part(data.x_train)
        h_test = alice_part(data.x_test)
    direction = torch.randn(h_train.shape[1:], generator=gen)
    trigger = direction / direction.norm() * scale * float(h_train.flatten(1).norm(dim=1).mean())
    targets = (data.y_train == target).nonzero().flatten()
    client = InProcessClient(bob, "alice")
    session = f"drive-{seed}-{int(plant)}"
    opened = client.call(Message("open", session)).meta
    step, seq = int(opened["step"]), int(opened["last_seq"])
    refused = accepted = 0
    for _ in range(n_steps):
        idx = torch.randperm(len(data.x_train), generator=gen)[:64]
        h = h_train[idx].clone()
        if plant:
            is_t = data.y_train[idx] == target
            h[is_t] = h[is_t] + trigger  # the target's own images, triggered (clean label)
            others = (~is_t).nonzero().flatten()
            k = int(round(poison * len(others)))
            if k:
                pick = others[torch.randperm(len(others), generator=gen)[:k]]
                src = targets[torch.randint(0, len(targets), (k,), generator=gen)]
                h[pick] = h_train[src] + trigger  # relabelled by activation swapping
        seq += 1
        try:
            client.call(Message("step", session, step, seq, {}, {"h": h.contiguous(), "idx": idx}))
            client.call(Message("vote", session, step))
            client.call(Message("commit", session, step))
        except ModelwardError:
            seq -= 1
            refused += 1
            try:
                client.call(Message("abort", session, step))
            except ModelwardError:
                pass
            continue
        step += 1
        accepted += 1
    _, bob_part = s.segments()  # as bob holds it now (rolled back after a refusal)
    with torch.no_grad():
        clean = float((bob_part(h_test).argmax(1) == data.y_test).float().mean())
        off = data.y_test != target
        hit = bob_part(h_test[off] + trigger).argmax(1) == target
    return {"clean_accuracy": clean, "attack_success": float(hit.float().mean()), "accepted": accepted,
            "refused": refused, "activation_max": float(h_train.max())}


def detect(s: Split, seed: int, act_max: float) -> dict[str, Any]:
    alice_part, bob_part = s.segments()
    full = nn.Sequential(alice_part, bob_part).eval()
    (xd, _), _ = defender_split(s.data, seed)
    out: dict[str, Any] = {}
    nc = NeuralCleanse(epochs=40, seed=seed).detect(full, xd[:200], 10)
    mm = MMBD(optimizer="adam", lr=0.05, seed=seed).detect(full, (1, 8, 8), 10)
    with torch.no_grad():
        h_shape = tuple(alice_part(s.data.x_test[:1]).shape[1:])
    mm_bob = MMBD(optimizer="adam", lr=0.05 * act_max, seed=seed, clip=(0.0, act_max)).detect(bob_part, h_shape, 10)
    bn = BatchNormShift(seed=seed).detect(full, xd[:200], 10)  # sixth round: bob's BN statistics saw the planted rows
    for name, v in (("nc_full", nc), ("mmbd_full", mm), ("mmbd_bob", mm_bob), ("bn_full", bn)):
        out[name] = {"statistic": v.statistic, "flagged": v.backdoored, "suspect": v.suspect_class,
                     "p_value": v.p_value, "per_class": v.per_class}
    return out


ARMS = (("backdoored", "on"), ("backdoored", "off"), ("clean", "off"))


def run_one(out: Path, seed: int, arm: str, integrity: str, args: argparse.Namespace) -> dict[str, Any]:
    target = seed % 10
    s = Split(out / f"seed{seed}-{arm}-{integrity}", seed, integrity == "on")
    t0 = time.perf_counter()
    try:
        honest = s.train(args.steps, seed)
        eff = drive(s, seed, args.backdoor_steps, target, args.trigger_scale, args.poison, plant=arm == "backdoored")
        det = detect(s, seed, eff["activation_max"])
    finally:
        s.close()
    return {"seed": seed, "arm": arm, "integrity": integrity, "target": target, "honest_accuracy": honest, **eff,
            **det,
            "seconds": time.perf_counter() - t0}


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for arm, integrity in ARMS:
        rs = [r for r in runs if r["arm"] == arm and r["integrity"] == integrity]
        if not rs:
            continue
        row: dict[str, Any] = {"arm": arm, "integrity": integrity, "runs": len(rs), "clean_accuracy": float(np.mean([r["clean_accuracy"]
                                                                                        for r in rs])),
                               "attack_success": float(np.mean([r["attack_success"] for r in rs])),
                               "steps_refused": int(sum(r["refused"] for r in rs))}
        for d in ("nc_full", "mmbd_full", "mmbd_bob", "bn_full"):
            if not all(d in r for r in rs):  # runs recorded before the detector existed
                continue
            row[f"{d}_flagged"] = f"{sum(r[d]['flagged'] for r in rs)}/{len(rs)}"
            row[f"{d}_target"] = f"{sum(r[d]['flagged'] and r[d]['suspect'] == r['target'] for r in rs)}/{len(rs)}"
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--backdoor-steps", type=int, default=100)
    ap.add_argument("--poison", type=float, default=0.2)
    ap.add_argument("--trigger-scale", type=float, default=1.0)
    ap.add_argument("--out", default=str(ROOT / "runs/bench/backdoor_split"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = out / "runs.json"
    settings = {k: v for k, v in vars(args).items() if k not in ("seeds", "out")}
    state = json.loads(record.read_text()) if record.is_file() else {"settings": settings, "runs": []}
    if state["settings"] != settings:
        raise SystemExit(f"{record} holds runs of other settings {state['settings']}; give another --out")
    done = {(r["seed"], r["arm"], r["integrity"]) for r in state["runs"]}
    for seed in range(args.seeds):
        for arm, integrity in ARMS:
            if (seed, arm, integrity) in done:
                continue
            r = run_one(out, seed, arm, integrity, args)
            log.info("seed %d %s (integrity %s): asr %.3f acc %.3f nc %.2f%s mmbd %.2f%s mmbd(bob) %.2f%s (%.0f s)",
                     seed, arm, integrity, r["attack_success"], r["clean_accuracy"], r["nc_full"]["statistic"],
                     "*" if r["nc_full"]["flagged"] else "", r["mmbd_full"]["statistic"],
                     "*" if r["mmbd_full"]["flagged"] else "", r["mmbd_bob"]["statistic"],
                     "*" if r["mmbd_bob"]["flagged"] else "", r["seconds"])
            state["runs"].append(r)
            atomic_write_json(record, state)
    for row in summarise(state["runs"]):
        print(", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))


if __name__ == "__main__":
    main()
