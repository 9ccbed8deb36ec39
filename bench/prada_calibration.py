"""Calibration of the PRADA extraction detector (issue #38 item 2): false alarms on benign streams of every shape a
user sends, and the queries it takes to flag the JBDA attacks, for the detector as it ships and for the first
version (raw distances, no window, no persistence, δ = 0.93) in the same run.

    .venv/bin/python bench/prada_calibration.py [--streams 100] [--quick]

The served model is the digits CNN of bench/ownership.py (its top-1 is what the detector sees). Benign shapes, all
natural digits images (1,797): ``random`` (one random order), ``class-sorted`` (grouped by class, classes in random
order: the stream #38 found flagged at query 192), ``repeated`` (random order, 5 % of queries re-sent), ``short``
(450 random images), ``long`` (two passes, 3,594 queries), and ``shifted`` (natural images and their 1-pixel
shifts, 6,000 queries: near-duplicates, reported but not a calibration target: they look like JBDA's small steps).
Attacks: the JBDA and JBDA-TR query streams of ``modelward.extraction.attacks`` against the CNN (2,000 queries).
Batches of 32 rows. Prints a table (false alarms with a 95 % Clopper–Pearson interval, the lowest W) and writes
``bench-prada-calibration.json``.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from scipy.stats import beta

from modelward.core.data import DataConfig
from modelward.core.train import TrainConfig, fit_from_config
from modelward.core.zoo import ModelConfig, build_model
from modelward.extraction.attacks import SubstituteConfig, TransferSet, make_extraction_attack
from modelward.extraction.ownership import PradaDetector
from modelward.extraction.victim import LocalVictim

DC = DataConfig(source="digits", test_fraction=0.25, seed=0)
MC = ModelConfig(arch="cnn", channels=[16, 32], fc=64)
TC = TrainConfig(lr=0.02, batch_size=32, steps=600, lr_schedule=[[0, 0.02], [400, 0.002]], eval_every=600)


class FirstPrada:
    """The detector before this calibration (for the comparison): raw distances, every distance since the start,
    flag on one test with W < 0.93, never cleared (tests at every 2 % growth, as it did)."""

    def __init__(self, delta: float = 0.93, min_queries: int = 100) -> None:
        from scipy.stats import shapiro

        self.shapiro, self.delta, self.min_queries = shapiro, delta, min_queries
        self.g: dict[int, list[np.ndarray]] = {}
        self.adm: dict[int, list[float]] = {}
        self.t: dict[int, float] = {}
        self.d: list[float] = []
        self.q = 0
        self.flagged_at: int | None = None
        self.tested = 0

    def observe(self, x: torch.Tensor, p: torch.Tensor) -> None:
        for v, c in zip(x.reshape(len(x), -1).numpy(), p.tolist(), strict=True):
            self.q += 1
            g = self.g.setdefault(c, [])
            if not g:
                g.append(v)
                self.adm[c], self.t[c] = [], 0.0
                continue
            d = float(np.sqrt(((np.stack(g) - v) ** 2).sum(1)).min())
            self.d.append(d)
            if d > self.t[c] and sum(len(s) for s in self.g.values()) < 5000:
                g.append(v)
                self.adm[c].append(d)
                self.t[c] = max(self.t[c], float(np.mean(self.adm[c]) - np.std(self.adm[c])))
        n = len(self.d)
        if n >= self.min_queries and n - self.tested >= max(1, n // 50):
            self.tested = n
            arr = np.asarray(self.d[-5000:])
            w = 1.0 if np.ptp(arr) == 0 else float(self.shapiro(arr).statistic)
            if w < self.delta and self.flagged_at is None:
                self.flagged_at = self.q


def cp(k: int, n: int) -> tuple[float, float]:
    lo = 0.0 if k == 0 else float(beta.ppf(0.025, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(0.975, k + 1, n - k))
    return lo, hi


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--quick", action="store_true", help="10 streams per shape")
    ap.add_argument("--shapes", default="random,class-sorted,repeated,short,long,shifted")
    ap.add_argument("--delta", type=float, default=None, help="override the shipped δ (a calibration candidate)")
    ap.add_argument("--consecutive", type=int, default=None, help="override the shipped count of tests")
    args = ap.parse_args()
    overrides = {k: v for k, v in (("delta", args.delta), ("consecutive", args.consecutive)) if v is not None}
    n_streams = 10 if args.quick else args.streams
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    owner, _, data = fit_from_config(DC, MC, TC, seed=0)
    owner.eval()
    allx = torch.cat([data.x_train, data.x_test])
    ally = torch.cat([data.y_train, data.y_test])
    with torch.no_grad():
        allp = owner(allx).argmax(1)
    pool = torch.cat([allx] + [torch.roll(allx, s, d) for s in (-1, 1) for d in (2, 3)])
    with torch.no_grad():
        poolp = owner(pool).argmax(1)

    def stream(shape: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        perm = torch.randperm(len(allx), generator=g)
        if shape == "random":
            idx = perm
        elif shape == "class-sorted":
            idx = torch.cat([perm[ally[perm] == c] for c in torch.randperm(10, generator=g).tolist()])
        elif shape == "repeated":
            out: list[int] = []
            for k in perm.tolist():
                out.append(k)
                if len(out) > 10 and float(torch.rand(1, generator=g)) < 0.05:
                    out.append(out[int(torch.randint(0, len(out) - 1, (1,), generator=g))])
            idx = torch.tensor(out)
        elif shape == "short":
            idx = perm[:450]
        elif shape == "long":
            idx = torch.cat([perm, torch.randperm(len(allx), generator=g)])
        elif shape == "shifted":
            idx = torch.randperm(len(pool), generator=g)[:6000]
            return pool[idx], poolp[idx]
        else:
            raise ValueError(shape)
        return allx[idx], allp[idx]

    def run(x: torch.Tensor, p: torch.Tensor) -> dict:
        det, first = PradaDetector(**overrides), FirstPrada()
        lowest = 1.0
        for i in range(0, len(x), 32):
            v, _ = det.observe("k", x[i : i + 32], p[i : i + 32])
            first.observe(x[i : i + 32], p[i : i + 32])
            lowest = min(lowest, v.shapiro_w if v.shapiro_w is not None else 1.0)
        return {"flagged_at": v.flagged_at, "flags": v.flags, "flagged_at_end": v.flagged, "lowest_w": lowest,
                "first_flagged_at": first.flagged_at}

    out: dict = {"streams": n_streams, "detector": vars(PradaDetector(**overrides)), "benign": {}, "attacks": {}}
    out["detector"] = {k: v for k, v in out["detector"].items() if not k.startswith("_") and k != "loader"}
    print(f"PRADA calibration on the digits CNN: {n_streams} benign streams per shape, batches of 32")
    print(f"{'shape':<13} {'queries':>7} {'false alarms':>13} {'95 % CI':>13} {'lowest W':>9} {'first version':>14}")
    for shape in args.shapes.split(","):
        res = [run(*stream(shape, s)) for s in range(n_streams)]
        k = sum(r["flagged_at"] is not None for r in res)
        k0 = sum(r["first_flagged_at"] is not None for r in res)
        lo, hi = cp(k, n_streams)
        q = len(stream(shape, 0)[0])
        out["benign"][shape] = {"queries": q, "false_alarms": k, "ci95": [lo, hi],
                                "lowest_w": min(r["lowest_w"] for r in res), "first_version_false_alarms": k0,
                                "flagged_at": [r["flagged_at"] for r in res if r["flagged_at"] is not None]}
        print(f"{shape:<13} {q:>7} {k:>9}/{n_streams:<3} {lo:>6.3f}–{hi:<6.3f} {out['benign'][shape]['lowest_w']:>9.3f} "
              f"{k0:>10}/{n_streams:<3}", flush=True)

    class Recorder(LocalVictim):
        def __init__(self, *a, **k) -> None:  # noqa: ANN002, ANN003
            super().__init__(*a, **k)
            self.stream: list[torch.Tensor] = []

        def query(self, x: torch.Tensor) -> torch.Tensor:
            self.stream.append(x.clone())
            return super().query(x)

    print(f"\n{'attack':<13} {'queries':>7} {'flagged at':>11} {'times':>6} {'first version':>14}")
    for q in ("jbda", "jbda_tr"):
        rec = Recorder(owner, num_classes=10)
        make_extraction_attack(q, "naive", substitute=SubstituteConfig(epochs=5)).run(
            rec, TransferSet(data.x_train), 2000, lambda: build_model(MC, (1, 8, 8), 10), seed=0)
        x = torch.cat(rec.stream)[:2000]
        with torch.no_grad():
            p = owner(x).argmax(1)
        r = run(x, p)
        out["attacks"][q] = r | {"queries": len(x)}
        print(f"{q:<13} {len(x):>7} {r['flagged_at']!s:>11} {r['flags']:>6} {r['first_flagged_at']!s:>14}")
    out["seconds"] = time.perf_counter() - t0
    with open("bench-prada-calibration.json", "w") as fh:
        json.dump(out, fh, indent=2, default=float)
    print(f"\n{out['seconds']:.0f} s; written bench-prada-calibration.json")


if __name__ == "__main__":
    main()
