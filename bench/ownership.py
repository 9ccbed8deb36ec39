"""Proof of ownership and extraction detection on the digits CNN (issue #30), in one run.

    .venv/bin/python bench/ownership.py [--innocent 30] [--budgets 1437,3000] [--quick]

Measures, with the guard's own mechanism in-process (ModelGuard-S ε = 1, then the answer watermark at 0.5 %;
the serving path is the same code, tested end to end in tests/e2e/test_guard_ownership.py):

1. **Watermark.** KnockoffNets copies (Naive soft-label training, the demo's architecture) made from ``budgets``
   queries — the attacker's natural pool is the digits training split, plus its 1-pixel shifts for budgets above
   it — and the watermark p-value of each copy (queries = its marked rows), with the scores statistic and the
   label-only one; then the same copy after fine-tuning (5 epochs on 200 labelled test rows), 50 % magnitude
   pruning, and distillation (a fresh model trained on the copy's soft labels over the attacker's pool).
2. **Fingerprint.** ``make_fingerprint`` with 3 + 8 reference models; p-values of the owner's weights fine-tuned,
   pruned 50 %, of the KnockoffNets copy, and of the distilled copy.
3. **False accusations.** ``--innocent`` independently trained models (same data, architecture, recipe; other
   seeds): how many are called derived at level 1e-6 (and at 0.01) by each test, with a 95 % Clopper–Pearson
   interval on the rate.
4. **Detector.** PRADA (the shipped defaults) on a JBDA-TR stream of 2,000 queries, on a KnockoffNets stream of natural
   queries, and on 100 benign streams (random orders of the digits images, 2,000 queries each).

Prints one table per part and writes ``bench-ownership.json`` in the working directory.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import beta

from modelward.core.data import DataConfig
from modelward.core.train import TrainConfig, fit_from_config
from modelward.core.zoo import ModelConfig, build_model
from modelward.extraction.attacks import EvalSet, SubstituteConfig, TransferSet, make_extraction_attack
from modelward.extraction.defenses import make_defense
from modelward.extraction.ownership import (
    AnswerWatermark,
    LocalSuspect,
    PradaDetector,
    WatermarkedVictim,
    make_fingerprint,
    random_seeds,
    verify_ownership,
)
from modelward.extraction.victim import LocalVictim

DC = DataConfig(source="digits", test_fraction=0.25, seed=0)
MC = ModelConfig(arch="cnn", channels=[16, 32], fc=64)
TC = TrainConfig(lr=0.02, batch_size=32, steps=600, lr_schedule=[[0, 0.02], [400, 0.002]], eval_every=600)


def cp_interval(k: int, n: int, conf: float = 0.95) -> tuple[float, float]:
    a = (1 - conf) / 2
    lo = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def fine_tune(model, x, y, epochs=5, lr=0.005, seed=0):
    m = build_model(MC, (1, 8, 8), 10)
    m.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9)
    g = torch.Generator().manual_seed(seed)
    m.train()
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=g)
        for i in range(0, len(x), 32):
            idx = perm[i : i + 32]
            loss = F.cross_entropy(m(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return m.eval()


def prune(model, share=0.5):
    m = build_model(MC, (1, 8, 8), 10)
    m.load_state_dict(model.state_dict())
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() > 1:
                thr = p.abs().flatten().kthvalue(int(share * p.numel())).values
                p[p.abs() <= thr] = 0.0
    return m.eval()


def distill(model, x, epochs=30, seed=0):
    with torch.no_grad():
        soft = torch.softmax(model(x), 1)
    torch.manual_seed(seed)
    m = build_model(MC, (1, 8, 8), 10)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.5)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=g)
        for i in range(0, len(x), 32):
            idx = perm[i : i + 32]
            loss = -(soft[idx] * F.log_softmax(m(x[idx]), 1)).sum(1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return m.eval()


def acc(model, data) -> float:
    with torch.no_grad():
        return float((model(data.x_test).argmax(1) == data.y_test).float().mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--innocent", type=int, default=30)
    ap.add_argument("--budgets", default="1437,3000")
    ap.add_argument("--quick", action="store_true", help="5 innocent models, 2 + 3 references, 20 benign streams")
    args = ap.parse_args()
    torch.set_num_threads(1)
    n_inn, n_sel, n_cal, n_benign = (5, 2, 3, 20) if args.quick else (args.innocent, 3, 8, 100)
    t0 = time.perf_counter()
    owner, _, data = fit_from_config(DC, MC, TC, seed=0)
    out: dict = {"owner_accuracy": acc(owner, data)}
    print(f"owner: test accuracy {out['owner_accuracy']:.4f}")
    pool = torch.cat([data.x_train] + [torch.roll(data.x_train, s, d) for s in (-1, 1) for d in (2, 3)])
    ev = EvalSet(data.x_test, data.y_test, owner(data.x_test).argmax(1))

    def factory():
        return build_model(MC, (1, 8, 8), 10)

    attack = make_extraction_attack("knockoff", "naive", substitute=SubstituteConfig(epochs=30, lr=0.05, lr_step=10))
    wm = AnswerWatermark(b"bench-ownership-key-0123456789ab", fraction=0.005)
    copies, rows = {}, []
    print("\n1. watermark: KnockoffNets copies through ModelGuard-S + 0.5 % watermark")
    print(f"{'queries':>8} {'copy acc':>9} {'marked':>7} {'scores: m/n':>12} {'p':>9} {'labels: m/n':>12} {'p':>9}")
    for b in [int(s) for s in args.budgets.split(",")]:
        victim = WatermarkedVictim(owner, make_defense("modelguard_s", epsilon=1.0), wm, num_classes=10)
        res = attack.run(victim, TransferSet(pool if b > len(data.x_train) else data.x_train), b, factory, seed=1,
                         eval_set=ev)
        recs = victim.records()
        s = verify_ownership(LocalSuspect(res.substitute), watermark=recs).evidence[0]
        lab = verify_ownership(LocalSuspect(res.substitute, labels_only=True), watermark=recs).evidence[0]
        copies[b] = (res.substitute, recs)
        rows.append({"queries": b, "copy_accuracy": res.accuracy, "marked": len(recs), "scores": s.to_dict(),
                     "labels": lab.to_dict(), "answers_changed": len(recs) / b})
        print(f"{b:>8} {res.accuracy:>9.4f} {len(recs):>7} {s.matches:>5}/{s.n:<6} {s.p_value:>9.2g} "
              f"{lab.matches:>5}/{lab.n:<6} {lab.p_value:>9.2g}")
    out["watermark"] = rows
    big = max(copies)
    copy, recs = copies[big]
    mods = {"fine-tuned": fine_tune(copy, data.x_test[:200], data.y_test[:200]), "pruned 50%": prune(copy),
            "distilled": distill(copy, pool)}
    print(f"\n   robustness of the mark ({big}-query copy)")
    out["watermark_robustness"] = {}
    for name, m in mods.items():
        e = verify_ownership(LocalSuspect(m), watermark=recs).evidence[0]
        out["watermark_robustness"][name] = {"accuracy": acc(m, data), **e.to_dict()}
        print(f"   {name:<11} acc {acc(m, data):.4f}  {e.matches}/{e.n}  p = {e.p_value:.2g}")

    print(f"\n2. fingerprint: {n_sel} selection + {n_cal} calibration references")
    refs = [fit_from_config(DC, MC, TC, seed=1000 + i)[0].eval() for i in range(n_sel + n_cal)]
    fp = make_fingerprint(owner, random_seeds(data.x_train, 600, seed=1000), refs[:n_sel], refs[n_sel:],
                          n_points=100, clip=(0.0, 1.0))
    print(f"   references agreed {min(fp.reference_agreement):.2f}–{max(fp.reference_agreement):.2f}; "
          f"null BetaBinomial({fp.null_alpha:.3g}, {fp.null_beta:.3g})")
    cases = {"owner": owner, "owner fine-tuned": fine_tune(owner, data.x_test[:200], data.y_test[:200]),
             "owner pruned 50%": prune(owner), "owner distilled": distill(owner, pool),
             "KnockoffNets copy": copy, "copy distilled": mods["distilled"]}
    out["fingerprint"] = {"reference_agreement": fp.reference_agreement}
    for name, m in cases.items():
        e = verify_ownership(LocalSuspect(m), fingerprint=fp).evidence[0]
        out["fingerprint"][name] = e.to_dict()
        print(f"   {name:<18} {e.matches}/{e.n}  p = {e.p_value:.2g}")

    print(f"\n3. false accusations over {n_inn} independently trained models")
    ps_w, ps_f = [], []
    for i in range(n_inn):
        m = fit_from_config(DC, MC, TC, seed=2000 + i)[0].eval()
        ps_w.append(verify_ownership(LocalSuspect(m), watermark=recs).p_value)
        ps_f.append(verify_ownership(LocalSuspect(m), fingerprint=fp).p_value)
    out["innocent"] = {"watermark_p": ps_w, "fingerprint_p": ps_f}
    for name, ps in (("watermark", ps_w), ("fingerprint", ps_f)):
        for level in (1e-6, 0.01):
            k = int(np.sum(np.array(ps) < level))
            lo, hi = cp_interval(k, len(ps))
            print(f"   {name:<11} p < {level:g}: {k}/{len(ps)}  (95 % CI {lo:.3f}–{hi:.3f}); min p {min(ps):.2g}")
            out["innocent"][f"{name}_below_{level:g}"] = {"k": k, "n": len(ps), "ci95": [lo, hi]}

    print("\n4. PRADA detector (the shipped defaults: δ = 0.92 on log distances, 6 successive tests)")
    allx = torch.cat([data.x_train, data.x_test])

    class Recorder(LocalVictim):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.stream = []

        def query(self, x):
            self.stream.append(x.clone())
            return super().query(x)

    def run_stream(x: torch.Tensor) -> tuple[bool, int | None, float | None]:
        with torch.no_grad():
            p = owner(x).argmax(1)
        det = PradaDetector()  # the calibrated defaults (bench/prada_calibration.py)
        v = None
        for i in range(0, len(x), 32):
            v, _ = det.observe("k", x[i : i + 32], p[i : i + 32])
        return v.flagged, v.flagged_at, v.shapiro_w

    out["detector"] = {}
    for name, q in (("jbda_tr", "jbda_tr"), ("knockoff", "knockoff")):
        rec = Recorder(owner, num_classes=10)
        make_extraction_attack(q, "naive", substitute=SubstituteConfig(epochs=5)).run(
            rec, TransferSet(data.x_train), 2000 if q == "jbda_tr" else len(data.x_train), factory, seed=0)
        flagged, at, w = run_stream(torch.cat(rec.stream)[:2000])
        out["detector"][name] = {"flagged": flagged, "flagged_at": at, "final_w": w}
        print(f"   {name:<9} flagged {flagged} at {at} queries (final W {w:.3f})")
    fa, ws = 0, []
    for s in range(n_benign):
        g = torch.Generator().manual_seed(s)
        idx = torch.randperm(len(allx), generator=g)
        idx = torch.cat([idx, idx[torch.randperm(len(idx), generator=g)]])[:2000]
        flagged, _, w = run_stream(allx[idx])
        fa += flagged
        ws.append(w)
    lo, hi = cp_interval(fa, n_benign)
    out["detector"]["benign"] = {"false_alarms": fa, "streams": n_benign, "ci95": [lo, hi], "min_w": min(ws)}
    print(f"   benign    false alarms {fa}/{n_benign} (95 % CI {lo:.3f}–{hi:.3f}); lowest final W {min(ws):.3f}")
    out["seconds"] = time.perf_counter() - t0
    with open("bench-ownership.json", "w") as fh:
        json.dump(out, fh, indent=2, default=float)
    print(f"\n{out['seconds']:.0f} s; written bench-ownership.json")


if __name__ == "__main__":
    main()
