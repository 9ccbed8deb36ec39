"""GloRo cost on digits (seed 002 Table 6.8): certification time vs a plain forward pass (goal ≤ 1.5×) and
training time per epoch vs standard training, same architecture, same run.

    .venv/bin/python bench/gloro_cost.py [--arch 2C2F] [--repeats 50] [--epochs 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from _timing import median_time

from modelward.core.data import DataConfig, load_data
from modelward.robustness.gloro import GloroNet, build_gloro_model, certify
from modelward.robustness.gloro.train import GloroTrainConfig, train_gloro


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="2C2F")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    d = load_data(DataConfig())
    x = torch.cat([d.x_train, d.x_test])  # all 1,797 digits
    y = torch.cat([d.y_train, d.y_test])
    model = build_gloro_model(args.arch, d.input_shape, d.num_classes, init="orthogonal")
    net = GloroNet(model, d.input_shape, 0.3)
    t_freeze = time.perf_counter()
    net.freeze()
    t_freeze = time.perf_counter() - t_freeze
    net.eval()

    @torch.no_grad()
    def plain() -> None:
        model(x).argmax(1)

    def cert() -> None:
        certify(net, x, y, batch_size=len(x))

    t_plain, t_cert = median_time(plain, args.repeats), median_time(cert, args.repeats)
    print(f"certification of {len(x)} points ({args.arch}): forward {t_plain * 1e3:.2f} ms, "
          f"GloRo certify {t_cert * 1e3:.2f} ms -> ratio {t_cert / t_plain:.2f}x (goal <= 1.5x); "
          f"one-off bound freeze {t_freeze * 1e3:.1f} ms")

    per_epoch = {}
    for loss in ("standard", "trades_kl"):
        m = build_gloro_model(args.arch, d.input_shape, d.num_classes, init="orthogonal")
        n = GloroNet(m, d.input_shape, 0.3)
        cfg = GloroTrainConfig(epochs=args.epochs + 1, batch_size=128, loss=loss, lr_decay_to=None)
        res = train_gloro(n, d.x_train, d.y_train, cfg)
        per_epoch[loss] = statistics.median(r["seconds"] for r in res.history[1:])  # skip warm-up epoch
    ratio = per_epoch["trades_kl"] / per_epoch["standard"]
    print(f"training per epoch ({len(d.x_train)} points, batch 128): standard {per_epoch['standard']:.3f} s, "
          f"GloRo (TRADES, 5 power iterations/step + per-epoch refresh) {per_epoch['trades_kl']:.3f} s "
          f"-> ratio {ratio:.2f}x (paper, GPU: 3-4x)")


if __name__ == "__main__":
    main()
