"""Issue 36's composition attacks, written independently of the self-audit, against real ``party serve`` processes,
next to the self-audit's own attacks (``governance.neighbour_audit``) on the same parties — under the shipped
defaults and under the owner's opt-out (``eval.noise = 0``, ``train_loss.noise = 0``): the two must agree within a
few points, and the opt-out shows that the attacks work where the release path does not stop them.

    python bench/composition_attacks.py [--steps 200] [--loss-probes 400] [--committed-probes 40]
                                        [--modes defaults,opt-out]

Bob starts from the demo's split CNN trained here (200 steps of 64, monolithic: the same part a split run trains)
and runs alone (the attacks need Alice's data key and the operator's control key only); every attack gets a Bob
process of its own on a fresh audit log (a UTC day's budget of its own). Alice knows one test and one training
label per class (the issue's attacks assumed as much). Printed per attack: rows, agreement (or labels recovered)
for the audit's implementation and for this one, and chance.

- ``eval_differencing``: 7 fixed test rows and a probe on a test index of known class c, one cross-entropy pass per
  class; softmax(-answers) is Bob's softmax at the probe. 64 probes (5,120 rows), a surrogate fitted to them.
- ``label_only``: the same passes with the error metric: "is Bob's top class at the probe c?"; classes asked in
  the order a nearest-class-mean classifier on the labels so far ranks them, probes picked by active learning
  (the smallest margin of that classifier); 3,000 rows.
- ``loss_oracle``: a step over 7 fixed training rows and training index i with a fixed probe activation, the loss
  read from the answer, the step aborted (400 indices); ``loss_oracle_committed``: the step committed and the loss
  read from the committed window of the next evaluation (40 indices; the attacker's control key opened Bob's
  session with learning rate 1e-9, so her probe steps do not move his part). A probe with no loss is guessed (class 0).
"""

from __future__ import annotations

import argparse
import time
import tomllib
from pathlib import Path

import torch
import torch.nn.functional as F

from modelward.core.data import DataConfig, load_data
from modelward.core.init import init_model_
from modelward.core.train import TrainConfig, train
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ModelwardError
from modelward.governance.demo import prepare_local_split
from modelward.governance.extraction_audit import PartyOracle
from modelward.governance.neighbour_audit import (
    Victim,
    eval_differencing_curve,
    label_only_curve,
    loss_oracle,
    query_pool,
)
from modelward.governance.party.config import TLSConfig
from modelward.governance.plan import segment_of
from modelward.governance.transport.client import GrpcPartyClient
from modelward.governance.transport.launch import spawn_party, stop_parties, wait_ready
from modelward.governance.wire import Message

EX = Path(__file__).resolve().parents[1] / "examples"
MODEL = ModelConfig(arch="cnn", channels=[16, 32], fc=64)
BOB = ["conv2", "fc1", "logits"]


class Raw:
    """Alice's data key and the operator's control key on one Bob, as raw protocol messages (no audit code)."""

    def __init__(self, address: str, tls: dict[str, TLSConfig], tc: TrainConfig) -> None:
        self.data = GrpcPartyClient("bob", address, tls["alice"], timeout=120)
        self.ctl = GrpcPartyClient("bob", address, tls["operator"], timeout=120)
        self.ctl.call(Message("open", "raw", meta={"train_cfg": tc.model_dump(mode="json")}))
        self.seq = int(self.data.call(Message("open", "raw")).meta["last_seq"])

    def send(self, op: str, meta: dict, h: torch.Tensor, idx: torch.Tensor, step: int = 0) -> Message:
        self.seq += 1
        try:
            return self.data.call(Message(op, "raw", step, self.seq, meta, {"h": h.contiguous(), "idx": idx}))
        except ModelwardError:
            self.seq -= 1
            raise

    def control(self, op: str, step: int = 0, meta: dict | None = None) -> Message:
        return self.ctl.call(Message(op, "raw", step, 0, meta or {}))

    def close(self) -> None:
        self.data.close()
        self.ctl.close()


def fit(h: torch.Tensor, soft: torch.Tensor, seed: int) -> torch.nn.Module:
    """A fresh copy of Bob's architecture fitted to soft labels (this script's own loop: SGD with momentum)."""
    torch.manual_seed(seed + 17)
    m = segment_of(build_model(MODEL, (1, 8, 8), 10), BOB)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(seed)
    for _ in range(400):
        i = torch.randint(len(h), (min(64, len(h)),), generator=g)
        loss = -(soft[i] * F.log_softmax(m(h[i]), 1)).sum(1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return m.eval()


def agree(m: torch.nn.Module, bob: torch.nn.Module, h_test: torch.Tensor) -> float:
    with torch.no_grad():
        return float((m(h_test).argmax(1) == bob(h_test).argmax(1)).float().mean())


def differencing(raw: Raw, probes, fixed, known, h_test, bob, metric="cross_entropy"):
    """Independent eval differencing: returns (rows, agreement, note)."""
    hs, ts, rows, note = [], [], 0, ""
    try:
        for p in probes:
            ans = []
            for c in range(10):
                r = raw.send("eval", {"split": "test", "metric": metric}, torch.cat([fixed, p[None]]),
                             torch.cat([torch.arange(7), torch.tensor([known[c]])]))
                rows += 8
                if r.meta.get("sum") is None:
                    raise ModelwardError(f"withheld: {r.meta.get('withheld', '')[:80]}")
                ans.append(float(r.meta["sum"]))
            hs.append(p[None])
            ts.append(torch.softmax(-torch.tensor(ans), 0)[None])
    except ModelwardError as e:
        note = str(e)[:100]
    if not hs:
        return rows, float("nan"), note
    return rows, agree(fit(torch.cat(hs), torch.cat(ts), 0), bob, h_test), note


def label_only(raw: Raw, pool, fixed, known, h_test, bob, rows_max: int):
    """Independent label-only: yes/no answers, nearest-class-mean ranking, smallest-margin probe selection."""
    labelled: list[tuple[torch.Tensor, int]] = []
    base, rows, note = None, 0, ""
    left = list(range(len(pool)))
    flat = pool.reshape(len(pool), -1)
    try:
        while rows < rows_max and left:
            means = {c: torch.stack([flat[i] for i, y in labelled if y == c]).mean(0)
                     for c in {y for _, y in labelled}}
            if len(means) >= 2:
                cs = sorted(means)
                d = torch.cdist(flat[left], torch.stack([means[c] for c in cs]))
                two = d.topk(2, largest=False).values
                pick = int((two[:, 1] - two[:, 0]).argmin())
                order = [cs[j] for j in d[pick].argsort().tolist()] + [c for c in range(10) if c not in means]
            else:
                pick, order = 0, list(range(10))
            i = left.pop(pick)
            ans: dict[int, float] = {}
            for c in order:
                r = raw.send("eval", {"split": "test", "metric": "error"}, torch.cat([fixed, pool[i:i + 1]]),
                             torch.cat([torch.arange(7), torch.tensor([known[c]])]))
                rows += 8
                if r.meta.get("sum") is None:
                    raise ModelwardError(f"withheld: {r.meta.get('withheld', '')[:80]}")
                ans[c] = float(r.meta["sum"])
                if base is not None and ans[c] < base + 0.5:
                    break
            base = min(ans.values()) if base is None else base
            labelled.append((i, min(ans, key=lambda c: ans[c])))
    except ModelwardError as e:
        note = str(e)[:100]
    if not labelled:
        return rows, float("nan"), note
    h = pool[[i for i, _ in labelled]]
    return rows, agree(fit(h, F.one_hot(torch.tensor([y for _, y in labelled]), 10).float(), 0), bob, h_test), note


def loss_labels(raw: Raw, probes, y_train, fixed_h, probe_h, known_train, commit: bool, h_eval):
    """Independent loss oracle: (rows, labels recovered, note)."""
    h = torch.cat([fixed_h, probe_h[None]])
    rows, note = 0, ""

    def one(i: int) -> float | None:
        nonlocal rows
        s = int(raw.control("status").meta["step"])
        r = raw.send("step", {}, h, torch.cat([torch.arange(7), torch.tensor([i])]), step=s)
        rows += 8
        if not commit:
            raw.control("abort", s)
            return r.meta.get("loss")
        raw.control("vote", s)
        raw.control("commit", s)
        ev = raw.send("eval", {"split": "test", "metric": "error"}, h_eval, torch.arange(8))
        if "budget" in str(ev.meta.get("withheld", "")):
            raise ModelwardError(f"withheld: {ev.meta['withheld'][:80]}")
        tl = ev.meta.get("train_loss")
        return tl["mean"] if isinstance(tl, dict) else None

    levels, got = {}, []
    try:
        for c, i in known_train.items():
            v = one(i)
            if v is not None:
                levels[c] = v
        for i in probes.tolist():
            v = one(i)
            got.append(min(levels, key=lambda c: abs(levels[c] - v)) if v is not None and levels else 0)
    except ModelwardError as e:
        note = str(e)[:100]
    if not got:
        return rows, float("nan"), note
    right = sum(g == int(y_train[i]) for g, i in zip(got, probes.tolist(), strict=False))
    if not levels:
        note = note or "no loss released (every probe guessed: class 0)"
    return rows, right / len(got), note


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--loss-probes", type=int, default=400)
    ap.add_argument("--committed-probes", type=int, default=40)
    ap.add_argument("--out", default=None, help="folder for the parties (default: a temporary one)")
    ap.add_argument("--modes", default="defaults,opt-out", help="which of defaults, opt-out to run")
    args = ap.parse_args()
    torch.set_num_threads(1)
    import tempfile

    root = Path(args.out or tempfile.mkdtemp(prefix="composition-"))
    data = load_data(DataConfig(source="digits", seed=0))
    tc = TrainConfig(optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=1e-4, batch_size=64, steps=args.steps,
                     eval_every=args.steps, loss="error")
    model = init_model_(build_model(MODEL, (1, 8, 8), 10), "glorot_uniform", 0)
    res = train(model, data.x_train, data.y_train, data.x_test, data.y_test, tc, seed=0)
    model.eval()
    alice, bob = segment_of(model, ["conv1"]), segment_of(model, BOB)
    with torch.no_grad():
        h_train, h_test = alice(data.x_train), alice(data.x_test)
    victim = Victim("bob", bob, lambda: segment_of(build_model(MODEL, (1, 8, 8), 10), BOB), 10)
    chance = float(torch.bincount(bob(h_test).argmax(1), minlength=10).max()) / len(h_test)
    print(f"bob: the demo's split CNN after {args.steps} steps (test accuracy {1 - res.curve[-1][1]:.3f}); "
          f"chance agreement {chance:.3f}")
    known = {c: int((data.y_test[7:] == c).nonzero()[0]) + 7 for c in range(10)}
    known_train = {c: int((data.y_train == c).nonzero()[0]) for c in range(10)}
    fixed = h_train[:7]
    pool = query_pool("natural", h_train, len(h_train), 2)
    probes = query_pool("natural", h_train, 64, 1)
    loss_probes = torch.arange(len(h_train) - args.loss_probes, len(h_train))
    committed = torch.arange(len(h_train) - args.committed_probes, len(h_train))
    shipped = tomllib.loads((EX / "policy_bob.toml").read_text())
    # the owner's opt-out: no noise, and no answer budget (what the attacks get where nothing stops them)
    opt_out = {**shipped, "eval": {**shipped.get("eval", {}), "noise": 0.0, "max_answers_per_day": 10**9,
                                   "max_rows_per_day": 10**9}, "train_loss": {"noise": 0.0}}
    # the attacker's control key opens Bob's session (he has not trained through the protocol here): learning rate
    # 1e-9, so that her committed probe steps leave his part as it is (her loss levels stay calibrated)
    tc_attack = tc.model_copy(update={"lr": 1e-9, "momentum": 0.0, "weight_decay": 0.0})
    modes = [m for m in (("shipped defaults", shipped), ("opt-out (noise 0)", opt_out))
             if m[0].split()[0].replace("shipped", "defaults") in args.modes.split(",")]
    for mode, policy in modes:
        split = prepare_local_split(root / mode.split()[0], model, data, ["alice", "bob"], ["conv1"], threads=1,
                                    exact=False, driver="operator", policies={
                                        "bob": policy, "alice": {"allow_peers": ["operator"], "training": True}})
        cfg, sroot = split.party_configs["bob"], split.root
        tls = {n: TLSConfig(ca=str(sroot / "certs/ca.pem"), cert=str(sroot / f"certs/{n}.pem"),
                            key=str(sroot / f"certs/{n}.key")) for n in ("alice", "operator")}
        pin = split.split_config(tc, 0, ).parties[1].pin()
        jobs = ["differencing", "label_only", "loss_oracle", "loss_oracle_committed"]
        print(f"\n{mode}:")
        print(f"{'attack':24s} {'rows (audit / here)':>22s} {'agreement/labels: audit':>25s} {'here':>7s}  note")
        for job in jobs:
            found = {}
            for impl in ("audit", "here"):
                k = f"{job}-{impl}"
                proc, off = spawn_party(cfg, sroot / f"{k}.log", [f"checkpoint_dir={sroot / k / 'ckpt'}",
                                                                  f"audit_db={sroot / k / 'audit.db'}"])
                p = wait_ready(proc, cfg, sroot / f"{k}.log", off)
                t0 = time.perf_counter()
                try:
                    if impl == "audit":
                        o = PartyOracle(p.address, tls["alice"], tls["operator"], pin)
                        o.control.call(Message("open", o.session, meta={"train_cfg": tc_attack.model_dump(mode="json")}))
                        o.probe_eval = (h_train[:8], torch.arange(8))
                        if job == "differencing":
                            pt = eval_differencing_curve(o, victim, probes, h_test, fixed, torch.arange(7), known,
                                                         [5120])
                        elif job == "label_only":
                            pt = label_only_curve(o, victim, pool, h_test, fixed, torch.arange(7), known, [3000])
                        else:
                            pt = [loss_oracle(o, loss_probes if job == "loss_oracle" else committed, data.y_train,
                                              fixed, torch.arange(7), h_train[7], known_train, "bob",
                                              commit=job != "loss_oracle")]
                        o.close()
                        found[impl] = (pt[-1].rows, pt[-1].agreement, pt[-1].note[:60])
                    else:
                        r = Raw(p.address, tls, tc_attack)
                        if job == "differencing":
                            found[impl] = differencing(r, probes, fixed, known, h_test, bob)
                        elif job == "label_only":
                            found[impl] = label_only(r, pool, fixed, known, h_test, bob, 3000)
                        else:
                            found[impl] = loss_labels(r, loss_probes if job == "loss_oracle" else committed,
                                                      data.y_train, fixed, h_train[7], known_train,
                                                      job != "loss_oracle", h_train[:8])
                        r.close()
                finally:
                    stop_parties([p])
                found[impl] = (*found[impl], time.perf_counter() - t0)
            a, h = found["audit"], found["here"]
            print(f"{job:24s} {a[0]:>10d} / {h[0]:<10d} {a[1]:>25.3f} {h[1]:>7.3f}  {h[2] or a[2]}")


if __name__ == "__main__":
    main()
