"""AutoAttack (standard) — modelward vs torchattacks: robust accuracy and wall time, same models, same points, one run.

    .venv/bin/python bench/autoattack.py [--points 100] [--epochs 30] [--threads 1] [--models cnn,pgd,gloro]
                                         [--device cpu|cuda]

Models (digits, 1×8×8 in [0, 1]):

- ``cnn``: the plasticity-study CNN (conv32-conv64-fc128), plain training — ℓ∞, ε ∈ {0.03, 0.06, 0.1};
- ``pgd``: 2C2F ReLU, PGD-AT (Madry, ℓ2 ε = 0.3, examples/robust_pgd.toml) — ℓ2, ε ∈ {0.3, 0.5, 0.7};
- ``gloro``: 2C2F MinMax GloRo net (examples/robust_gloro.toml), attacked through its underlying model — ℓ2,
  ε ∈ {0.1, 0.3, 0.5}.

Both sides run the paper's standard settings: APGD-CE, APGD-T (9 targets), FAB-T (9 targets) at 100 iterations,
Square at 5,000 queries. torchattacks' ``AutoAttack(version="standard")`` ships with 10 iterations; the bench sets
its members to 100 (``--ta-steps`` to change) so both do the same work, and also reports the shipped setting's
robust accuracy once per model (``--ta-shipped``). Prints robust accuracy (ours, theirs, difference in points) and
the time ratio theirs / ours (goal ≥ 1.0×, aim 2×). torchattacks is installed by `make bench` (``--no-deps``).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

from modelward.core.config import load_config
from modelward.core.data import load_data
from modelward.core.zoo import ModelConfig, build_model
from modelward.robustness.attacks import AutoAttack
from modelward.robustness.attacks.base import predict
from modelward.robustness.experiment import RobustConfig, train_robust

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
EPS = {"cnn": ("linf", (0.03, 0.06, 0.1)), "pgd": ("l2", (0.3, 0.5, 0.7)), "gloro": ("l2", (0.1, 0.3, 0.5))}


def _cnn() -> torch.nn.Module:
    d = load_digits()
    x = torch.tensor(d.data / 16, dtype=torch.float32).view(-1, 1, 8, 8)
    y = torch.tensor(d.target)
    torch.manual_seed(0)
    m = build_model(ModelConfig(arch="cnn", channels=[32, 64], fc=128, batch_norm=False), (1, 8, 8), 10)
    opt = torch.optim.Adam(m.parameters(), 1e-3)
    for i in range(300):
        idx = torch.arange(i * 64 % 1344, i * 64 % 1344 + 64)
        opt.zero_grad()
        F.cross_entropy(m(x[idx]), y[idx]).backward()
        opt.step()
    return m.eval()


def _trained(example: str, epochs: int) -> torch.nn.Module:
    cfg = load_config(EXAMPLES / example, RobustConfig, [f"train.epochs={epochs}"])
    data = load_data(cfg.data)
    with tempfile.TemporaryDirectory() as tmp:
        outcome = train_robust(cfg, data, Path(tmp))
    return outcome.model.eval()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _points(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    cfg = RobustConfig()
    data = load_data(cfg.data)
    return data.x_test[:n], data.y_test[:n]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", type=int, default=100)
    ap.add_argument("--epochs", type=int, default=30, help="training epochs of the PGD-AT and GloRo nets")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", default="cnn,pgd,gloro")
    ap.add_argument("--ta-steps", type=int, default=100)
    ap.add_argument("--ta-shipped", action="store_true", help="also run torchattacks' shipped 10-step setting")
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N: models and points are moved there")
    args = ap.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    try:
        import torchattacks
    except ImportError:
        torchattacks = None
        print("torchattacks not installed (pip install --no-deps 'torchattacks>=3.5'): ours only")
    x, y = _points(args.points)
    x, y = x.to(device), y.to(device)
    rows = []
    for name in args.models.split(","):
        t0 = time.perf_counter()
        model = _cnn() if name == "cnn" else _trained("robust_pgd.toml" if name == "pgd" else "robust_gloro.toml",
                                                       args.epochs)
        model = model.to(device)
        clean = float((predict(model, x) == y).float().mean())
        print(f"== {name}: clean accuracy {clean:.3f} on {len(y)} test points (trained in "
              f"{time.perf_counter() - t0:.0f} s)", flush=True)
        norm, epsilons = EPS[name]
        for eps in epsilons:
            t = time.perf_counter()
            res = AutoAttack(model, eps=eps, norm=norm, seed=0)(x, y)
            _sync(device)
            ours_s = time.perf_counter() - t
            ours = 1 - res.success_rate
            line = f"{name:>5} {norm} ε={eps:<5} ours {ours:.3f} ({ours_s:6.1f} s; {res.counts()})"
            row = {"model": name, "norm": norm, "eps": eps, "ours": ours, "ours_s": ours_s}
            if torchattacks is not None:
                ref = torchattacks.AutoAttack(model, norm="Linf" if norm == "linf" else "L2", eps=eps,
                                              version="standard", n_classes=10, seed=0)
                if args.ta_shipped and eps == epsilons[0]:
                    shipped = float((predict(model, ref(x, y)) == y).float().mean())
                    print(f"      torchattacks as shipped (10 iterations): {shipped:.3f}")
                for member in ref._autoattack.attacks[:3]:
                    member.steps = args.ta_steps
                t = time.perf_counter()
                adv = ref(x, y)
                _sync(device)
                ta_s = time.perf_counter() - t
                theirs = float((predict(model, adv) == y).float().mean())
                row |= {"theirs": theirs, "theirs_s": ta_s}
                line += (f" | torchattacks {theirs:.3f} ({ta_s:6.1f} s) | diff {100 * (ours - theirs):+.1f} pt"
                         f" | speed {ta_s / ours_s:.2f}×")
            print(line, flush=True)
            rows.append(row)
    if torchattacks is not None and rows:
        tot_o, tot_t = sum(r["ours_s"] for r in rows), sum(r["theirs_s"] for r in rows)
        worst = max(abs(r["ours"] - r["theirs"]) for r in rows)
        print(f"total: ours {tot_o:.1f} s, torchattacks {tot_t:.1f} s, speed {tot_t / tot_o:.2f}× "
              f"(goal ≥ 1.0×, aim 2×); largest robust-accuracy difference {100 * worst:.1f} points")


if __name__ == "__main__":
    main()
