"""Square equal to the reference, point by point (issue 38 item 3).

Runs modelward's ``Square`` (AutoAttack's member), torchattacks' ``Square`` and — if given — the original AutoAttack
code (``--fra31 DIR``: a folder holding fra31/auto-attack's ``autoattack`` package, e.g. from ``git archive``) on the
same points with the same seed, and prints per norm: robust accuracy of each, the points where they disagree, the
largest difference of the adversarial inputs, and the stronger ``square_full`` variant for comparison.

Models: the digits MLP of the tests (1×8×8, 60 correctly classified held-out points) and a small RGB CNN on
``synthetic_images`` (3×16×16, 40 points): with three channels torchattacks 3.5's ℓ2 step differs from the
reference's (it measures the freed window mass over the image, the reference per channel since March 2021).

Usage::

    PYTHONPATH=src python bench/square_reference.py [--queries 5000] [--fra31 /tmp/fra31]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from modelward.robustness.attacks import Square
from modelward.robustness.attacks.base import predict
from modelward.robustness.attacks.square_full import SquareFull


def digits_model() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data / 16, dtype=torch.float32).view(-1, 1, 8, 8)
    y = torch.tensor(d.target)
    torch.manual_seed(0)
    m = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.Adam(m.parameters(), 1e-2)
    for _ in range(250):
        opt.zero_grad()
        F.cross_entropy(m(x[:1400]), y[:1400]).backward()
        opt.step()
    m.eval()
    keep = predict(m, x[1400:]) == y[1400:]
    return m, x[1400:][keep][:60], y[1400:][keep][:60]


def rgb_model() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    from modelward.core.data import DataConfig, load_data

    d = load_data(DataConfig(source="synthetic_images", channels=3, image_size=16, n_samples=800, num_classes=5,
                             noise=0.9))
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(512, 5))
    opt = torch.optim.Adam(m.parameters(), 1e-2)
    for _ in range(150):
        opt.zero_grad()
        F.cross_entropy(m(d.x_train), d.y_train).backward()
        opt.step()
    m.eval()
    keep = predict(m, d.x_test) == d.y_test
    return m, d.x_test[keep][:40], d.y_test[keep][:40]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queries", type=int, default=5000)
    ap.add_argument("--fra31", default=None, help="folder with fra31/auto-attack's autoattack package")
    args = ap.parse_args()
    torch.set_num_threads(1)
    import torchattacks

    ref_cls = None
    if args.fra31:
        sys.path.insert(0, args.fra31)
        from autoattack.square import SquareAttack  # type: ignore[import-not-found]

        ref_cls = SquareAttack
    for name, (model, x, y), budgets in (("digits MLP", digits_model(), (("linf", 0.1), ("l2", 0.8))),
                                         ("RGB CNN", rgb_model(), (("linf", 0.1), ("l2", 1.5)))):
        for norm, eps in budgets:
            t0 = time.perf_counter()
            ours = Square(model, eps=eps, norm=norm, n_queries=args.queries, seed=0)(x, y)
            t_ours = time.perf_counter() - t0
            ta_norm = "Linf" if norm == "linf" else "L2"
            t0 = time.perf_counter()
            ta = torchattacks.Square(model, norm=ta_norm, eps=eps, n_queries=args.queries, seed=0)(x, y)
            t_ta = time.perf_counter() - t0
            full = SquareFull(model, eps=eps, norm=norm, n_queries=args.queries, seed=0)(x, y)
            rows = {"modelward square": (ours.x_adv, t_ours), "torchattacks": (ta, t_ta)}
            if ref_cls is not None:
                t0 = time.perf_counter()
                with torch.no_grad():
                    fra = ref_cls(model, norm=ta_norm, eps=eps, n_queries=args.queries, seed=0).perturb(x, y)
                rows["fra31 (original)"] = (fra, time.perf_counter() - t0)
            print(f"{name}, {norm} ε = {eps:.4g}, {len(y)} points, {args.queries} queries:")
            for label, (adv, sec) in rows.items():
                ok = predict(model, adv) == y
                diff = int((ok != ~ours.success).sum())
                print(f"  {label:18s} robust accuracy {float(ok.float().mean()):.3f}  points differing from "
                      f"modelward's: {diff}  max |Δx_adv| {float((adv - ours.x_adv).abs().max()):.2e}  {sec:.1f} s")
            print(f"  {'square_full':18s} robust accuracy {1 - full.success_rate:.3f} (the stronger variant)")


if __name__ == "__main__":
    main()
