"""PGD-40 (L∞) throughput: modelward vs torchattacks vs ART, same model, same batch, one run.

    .venv/bin/python bench/pgd_throughput.py [--batch 256] [--repeats 3] [--threads 1]

Model: the digits CNN of the plasticity study (conv32-conv64-fc128, 8×8 inputs), trained for a few steps so the
gradients are not degenerate. Prints images/s per implementation and the ratios (goal: ≥ 1.0× torchattacks,
≥ 2× ART). A library that is not installed is reported as such (install: pip install --no-deps torchattacks
adversarial-robustness-toolbox tqdm — plain `pip install torchattacks` pulls torchvision, which replaces a CPU
torch with a CUDA build).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from _timing import median_time
from sklearn.datasets import load_digits

from modelward.core.zoo import ModelConfig, build_model
from modelward.robustness.attacks.pgd import PGD

EPS, STEPS = 0.1, 40
ALPHA = 2.5 * EPS / STEPS


def _model() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    d = load_digits()
    x = torch.tensor(d.data / 16, dtype=torch.float32).view(-1, 1, 8, 8)
    y = torch.tensor(d.target)
    torch.manual_seed(0)
    m = build_model(ModelConfig(arch="cnn", channels=[32, 64], fc=128, batch_norm=False), (1, 8, 8), 10)
    opt = torch.optim.Adam(m.parameters(), 1e-3)
    for i in range(100):
        idx = torch.arange(i * 64 % 1400, i * 64 % 1400 + 64)
        opt.zero_grad()
        F.cross_entropy(m(x[idx]), y[idx]).backward()
        opt.step()
    return m.eval(), x, y


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, x, y = _model()
    xb, yb = x[: args.batch], y[: args.batch]
    results: dict[str, float] = {}
    robust: dict[str, float] = {}

    ours = PGD(model, EPS, ALPHA, STEPS, "linf", random_start=True)
    results["modelward"] = median_time(lambda: ours(xb, yb), args.repeats)
    robust["modelward"] = 1 - ours(xb, yb).success_rate

    try:
        import torchattacks

        ta = torchattacks.PGD(model, eps=EPS, alpha=ALPHA, steps=STEPS, random_start=True)
        results["torchattacks"] = median_time(lambda: ta(xb, yb), args.repeats)
        x_ta = ta(xb, yb)
        with torch.no_grad():
            robust["torchattacks"] = float((model(x_ta).argmax(1) == yb).float().mean())
    except ImportError as e:
        print(f"torchattacks: not installed ({e})")

    try:
        import numpy as np
        from art.attacks.evasion import ProjectedGradientDescent
        from art.estimators.classification import PyTorchClassifier

        clf = PyTorchClassifier(model=model, loss=torch.nn.CrossEntropyLoss(), input_shape=(1, 8, 8), nb_classes=10,
                                clip_values=(0.0, 1.0), device_type="cpu")
        art_pgd = ProjectedGradientDescent(clf, norm=np.inf, eps=EPS, eps_step=ALPHA, max_iter=STEPS,
                                           num_random_init=1, batch_size=args.batch, verbose=False)
        xn, yn = xb.numpy(), yb.numpy()
        results["ART"] = median_time(lambda: art_pgd.generate(xn, yn), args.repeats)
        x_art = torch.from_numpy(art_pgd.generate(xn, yn))
        with torch.no_grad():
            robust["ART"] = float((model(x_art).argmax(1) == yb).float().mean())
    except ImportError as e:
        print(f"ART: not installed ({e})")

    print(f"PGD-{STEPS} L∞ ε={EPS}, batch {args.batch}, {args.threads} thread(s), median of {args.repeats}")
    print(f"{'implementation':<14} {'seconds':>9} {'images/s':>10} {'robust acc':>11}")
    for name, sec in results.items():
        print(f"{name:<14} {sec:9.3f} {args.batch / sec:10.1f} {robust[name]:11.3f}")
    for base in ("torchattacks", "ART"):
        if base in results:
            print(f"speed-up vs {base}: {results[base] / results['modelward']:.2f}x")


if __name__ == "__main__":
    main()
