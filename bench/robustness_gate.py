"""The robustness card and the `assess diff --fail-on robustness:-5` gate on honest re-runs and on a real drop
(issue 38: a gate fires only on a change larger than the noise of two honest runs).

A small MLP (64 → 32 → 10) is trained in plain PyTorch on scikit-learn's bundled digits (1,000 training images,
pixels in [0, 1]); its PGD-L∞ robust accuracy at ε is recorded exactly as the robustness section records it
(:func:`modelward.assess.sections.robustness.add_threat_metric`: Clopper–Pearson interval, interval-based card) and
two such reports are compared with :func:`modelward.assess.diff.compare`:

- *honest, unpaired*: the recipe retrained with another seed and evaluated on another random draw of the test
  points (Newcombe's interval of the change);
- *honest, paired*: the same model on the same points, PGD's random start drawn from another seed, per-point
  outcomes recorded (Newcombe's paired interval);
- *real drop*: the same model attacked at 1.25ε (``--drop``), standing in for a model that became less robust.

Each is run for ``--pairs`` pairs; the script prints the alarms of the interval gate (this change) and of the
previous rule (significant *and* point change past −5 points) side by side.

Usage::

    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/robustness_gate.py [--pairs 10] [--points 400] [--eps 0.05] [--drop 1.25]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from sklearn.datasets import load_digits

from modelward.assess.diff import compare, parse_fail_on
from modelward.assess.outcomes import points_id
from modelward.assess.sections.common import SectionResult
from modelward.assess.sections.robustness import add_threat_metric, set_threat_headline
from modelward.robustness.attacks import make_attack


def _train(x: torch.Tensor, y: torch.Tensor, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    opt = torch.optim.Adam(m.parameters(), lr=0.01)
    for _ in range(300):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    return m.eval()


def _outcomes(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, seed: int) -> np.ndarray:
    torch.manual_seed(seed)  # PGD's random start
    adv = make_attack("pgd", m, eps=eps, steps=10, clip=(0.0, 1.0))(x, y).x_adv
    with torch.no_grad():
        return (m(adv).argmax(1) == y).numpy()


def _report(o: np.ndarray, eps: float, points: dict | None) -> dict:
    res = SectionResult("robustness", "Robustness")
    add_threat_metric(res, "pgd", "linf", eps, float(o.mean()), len(o), "pixels in [0, 1]",
                      outcomes=o.tolist() if points else None, points=points)
    set_threat_headline(res)
    return {"sections": [res.to_dict()], "verdict": res.verdict}


def _old_rule(c: object) -> bool:
    """The gate before issue 38's change: significant and the *point* change past the allowed −5 points."""
    return bool(c.significant and c.delta is not None and c.delta <= -5)  # type: ignore[attr-defined]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--points", type=int, default=400)
    ap.add_argument("--eps", type=float, default=0.05)
    ap.add_argument("--drop", type=float, default=1.25, help="the real drop: the same model attacked at DROP·ε")
    a = ap.parse_args()
    t0 = time.perf_counter()
    d = load_digits()
    x = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target)
    xtr, ytr, xte, yte = x[:1000], y[:1000], x[1000:], y[1000:]
    gates = parse_fail_on("robustness:-5")
    rows = []
    rng = np.random.default_rng(0)
    for i in range(a.pairs):
        m1, m2 = _train(xtr, ytr, 2 * i), _train(xtr, ytr, 2 * i + 1)
        p1, p2 = (torch.tensor(rng.choice(len(yte), a.points, replace=False)) for _ in range(2))
        o1 = _outcomes(m1, xte[p1], yte[p1], a.eps, 0)
        o2 = _outcomes(m2, xte[p2], yte[p2], a.eps, 0)
        r1, r2 = _report(o1, a.eps, None), _report(o2, a.eps, None)
        un = next(iter(compare(r1, r2, gates)))
        again = _outcomes(m1, xte[p1], yte[p1], a.eps, 1000 + i)
        pts = points_id(xte[p1], yte[p1])  # the id the robustness section stores (rows, n, SHA-256)
        pa = next(iter(compare(_report(o1, a.eps, pts), _report(again, a.eps, pts), gates)))
        drop = _outcomes(m1, xte[p1], yte[p1], a.drop * a.eps, 0)
        dr_un = next(iter(compare(r1, _report(drop, a.eps, None), gates)))
        dr_pa = next(iter(compare(_report(o1, a.eps, pts), _report(drop, a.eps, pts), gates)))
        assert pa.interval.startswith("paired") and un.interval.startswith("unpaired"), (pa.interval, un.interval)
        rows.append((o1.mean(), r1["verdict"], un, pa, dr_un, dr_pa))
        print(f"pair {i}: RA {o1.mean():.3f} ({r1['verdict']}) vs retrain {o2.mean():.3f}: Δ {un.delta:+.1f} "
              f"CI [{un.delta_ci[0]:+.1f}, {un.delta_ci[1]:+.1f}] fires={bool(un.gated)} old={_old_rule(un)} | "
              f"restart Δ {pa.delta:+.1f} CI [{pa.delta_ci[0]:+.1f}, {pa.delta_ci[1]:+.1f}] fires={bool(pa.gated)} | "
              f"{a.drop:g}ε drop Δ {dr_un.delta:+.1f}: unpaired CI [{dr_un.delta_ci[0]:+.1f}, {dr_un.delta_ci[1]:+.1f}] "
              f"fires={bool(dr_un.gated)}, paired CI [{dr_pa.delta_ci[0]:+.1f}, {dr_pa.delta_ci[1]:+.1f}] "
              f"fires={bool(dr_pa.gated)}", flush=True)
    n = len(rows)
    print(f"\nhonest retrain, other points (unpaired): {sum(bool(r[2].gated) for r in rows)}/{n} alarms "
          f"(previous point rule: {sum(_old_rule(r[2]) for r in rows)}/{n})")
    print(f"honest PGD restart, same points (paired): {sum(bool(r[3].gated) for r in rows)}/{n} alarms "
          f"(previous point rule: {sum(_old_rule(r[3]) for r in rows)}/{n})")
    print(f"real drop ({a.drop:g}ε), unpaired: {sum(bool(r[4].gated) for r in rows)}/{n} fire; paired: "
          f"{sum(bool(r[5].gated) for r in rows)}/{n} fire; mean Δ {np.mean([r[4].delta for r in rows]):+.1f} pts")
    print(f"cards: {sorted({r[1] for r in rows})}; {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
