"""The privacy verdict and the `assess diff` privacy gate on two MLPs of one tabular task (issue 38 item 1).

An *overfit* MLP (two hidden layers of 256, 1,500 full-batch Adam steps: train 100 %, test ≈ 86 %) and a
*regularised* one (two hidden units, weight decay: train–test gap ≈ 1 point) are trained in plain PyTorch on
seeded synthetic data (scikit-learn's ``make_classification``: 600 training rows = members, 600 test rows), saved as
``model.pt`` with their CSVs, assessed with ``modelward assess`` (privacy section, quick profile: 250 members
against 250 non-members), and compared with ``modelward assess diff OLD NEW --fail-on privacy:+2`` both ways.
``--reruns K`` also retrains the regularised recipe with K other seeds and diffs each against the first: honest
re-runs whose gate must stay silent.

Usage::

    PYTHONPATH=src python bench/privacy_gate.py --out runs/privacy_gate [--reruns 10]

Prints each model's accuracies, verdict, the figures behind it, the gate's decisions and the false alarms of the
honest re-runs.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import torch

NETS = '''
from torch import nn


def mlp(input_shape, num_classes, hidden=256):
    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0], hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                         nn.ReLU(), nn.Linear(hidden, num_classes))
'''

RECIPES = {"overfit": {"hidden": 256, "steps": 1500, "weight_decay": 0.0},
           "regularised": {"hidden": 2, "steps": 300, "weight_decay": 1e-2}}


def make_data(folder: Path, seed: int = 0) -> tuple[np.ndarray, ...]:
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=1200, n_features=20, n_informative=10, n_redundant=2, flip_y=0.05,
                               random_state=seed)
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", slice(0, 600)), ("test", slice(600, 1200))):
        with (folder / f"{name}.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow([*(f"f{i}" for i in range(20)), "label"])
            for r, lab in zip(x[rows], y[rows], strict=True):
                w.writerow([*(repr(float(v)) for v in r), int(lab)])
    (folder / "nets.py").write_text(textwrap.dedent(NETS))
    return x[:600], y[:600], x[600:], y[600:]


def train(folder: Path, recipe: str, data: tuple[np.ndarray, ...], seed: int) -> tuple[float, float]:
    """Train in plain PyTorch on the standardised rows (as `modelward assess` standardises CSVs) and save."""
    sys.path.insert(0, str(folder))
    from nets import mlp  # type: ignore[import-not-found]

    xtr, ytr, xte, yte = data
    mu, sd = xtr.mean(0), xtr.std(0)
    xt, yt = torch.tensor((xtr - mu) / sd, dtype=torch.float32), torch.tensor(ytr)
    xv, yv = torch.tensor((xte - mu) / sd, dtype=torch.float32), torch.tensor(yte)
    r = RECIPES[recipe]
    torch.manual_seed(seed)
    model = mlp((20,), 2, hidden=r["hidden"])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=r["weight_decay"])
    for _ in range(r["steps"]):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xt), yt).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        acc = [float((model(a).argmax(1) == b).float().mean()) for a, b in ((xt, yt), (xv, yv))]
    torch.save(model.state_dict(), folder / f"{recipe}_{seed}.pt")
    return acc[0], acc[1]


def assess(folder: Path, recipe: str, seed: int, out: Path) -> dict:
    from modelward.assess import AssessConfig, run_assessment
    from modelward.core.entrypoints import trust_code

    trust_code()  # the operator's decision: this script wrote nets.py itself (a config can no longer say so)
    r = RECIPES[recipe]
    cfg = AssessConfig.model_validate({
        "name": f"{recipe}-{seed}", "checkpoint": str(folder / f"{recipe}_{seed}.pt"), "profile": "quick",
        "sections": ["privacy"],
        "model": {"arch": "entrypoint", "entrypoint": "nets:mlp", "kwargs": {"hidden": r["hidden"]}},
        "data": {"source": "csv", "path": str(folder / "train.csv"), "test_path": str(folder / "test.csv"),
                 "label_column": "label"},
        "train": {"optimizer": "adam", "lr": 1e-2, "weight_decay": r["weight_decay"], "batch_size": 600,
                  "steps": r["steps"]},
    }).resolve_paths(folder)
    run_assessment(cfg, out)
    return json.loads((out / "report.json").read_text())


def describe(report: dict) -> str:
    s = next(s for s in report["sections"] if s["section"] == "privacy")
    figures = "; ".join(f"{m['key']} {m['value']:.3f} [{m['ci'][0]:.3f}, {m['ci'][1]:.3f}]" if m.get("ci") else
                        f"{m['key']} {m['value']:.3f}" for m in s["metrics"] if m["context"].get("thresholds"))
    return f"verdict {s['verdict']} ({s['headline']['label']}: {s['headline']['text']}); {figures}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/privacy_gate"))
    ap.add_argument("--reruns", type=int, default=0, help="honest re-trainings of the regularised recipe to diff")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from modelward.assess.diff import compare, parse_fail_on

    folder = args.out.resolve() / "model"
    data = make_data(folder)
    reports = {}
    for recipe in RECIPES:
        t0 = time.perf_counter()
        tr, te = train(folder, recipe, data, seed=0)
        reports[recipe] = assess(folder, recipe, 0, args.out.resolve() / f"assess-{recipe}-0")
        print(f"{recipe}: train {100 * tr:.1f} %, test {100 * te:.1f} % (gap {100 * (tr - te):.1f} points); "
              f"{describe(reports[recipe])} [{time.perf_counter() - t0:.0f} s]")
    gate = parse_fail_on("privacy:+2")
    for a, b in (("overfit", "regularised"), ("regularised", "overfit")):
        changes = [c for c in compare(reports[a], reports[b], gate) if c.section == "privacy"]
        fired = [f"{c.key} {c.delta:+.2f} [{c.delta_ci[0]:+.2f}, {c.delta_ci[1]:+.2f}]" if c.delta_ci else c.key
                 for c in changes if c.gated]
        print(f"diff {a} → {b} --fail-on privacy:+2: {'FAILED ' + ', '.join(fired) if fired else 'passes'}")
    alarms = 0
    for seed in range(1, args.reruns + 1):
        tr, te = train(folder, "regularised", data, seed=seed)
        rep = assess(folder, "regularised", seed, args.out.resolve() / f"assess-regularised-{seed}")
        fired = [c.key for c in compare(reports["regularised"], rep, gate) if c.gated]
        alarms += bool(fired)
        print(f"  re-run seed {seed}: train {100 * tr:.1f} %, test {100 * te:.1f} %; {describe(rep)}; "
              f"gate {'FIRED ' + ', '.join(fired) if fired else 'silent'}")
    if args.reruns:
        print(f"honest re-runs: {alarms} false alarm(s) in {args.reruns}")


if __name__ == "__main__":
    main()
