"""The input-leakage audit's decoder attack against an independent implementation (issue 36 items 4 and 7).

``modelward split audit-leakage`` scores Bob's query-free decoder attack (He et al. 2019;
``governance.leakage.inversion.decoder_attack``: a surrogate of Alice's part trained through Bob's frozen part,
then a decoder, two phases, an MLP decoder). ``independent_decoder`` in ``tests/governance/test_input_privacy.py``
is the same attack written again, differently (one joint loss, batches drawn with replacement, a convolutional
decoder). Both run here on the audit's own setting — the digits split of ``examples/leakage_digits.toml`` (CNN 16-32
fc 64, Alice holds conv1, 200 steps of 64; 30 % public rows as Bob's auxiliary data; Bob's default Marvell
protection) — on the same 256 private rows' last activations, at the audit's budgets (1500 + 1500 steps; the joint
one 2100), per seed; printed: SSIM and MSE of both, their difference, and the no-leak references.

    python bench/input_leakage_crosscheck.py [--seeds 0,1] [--steps 200] [--independent-steps 2100]

Bounded: one short training and two attacks per seed (≈ 1-2 minutes per seed on a quiet 2-core host).
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import torch

from modelward.core.data import DataConfig, load_data
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig, build_model
from modelward.governance.leakage.inputs import ATTACK_SEED, _train, split_rows
from modelward.governance.leakage.inversion import baselines, decoder_attack, reconstruction_scores
from modelward.governance.party.input_protection import InputProtectionConfig
from modelward.governance.party.label_protection import LabelProtectionConfig
from modelward.governance.plan import segment_of

ROOT = Path(__file__).resolve().parents[1]


def _independent():
    spec = importlib.util.spec_from_file_location("input_privacy_tests",
                                                  ROOT / "tests/governance/test_input_privacy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod.independent_decoder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--independent-steps", type=int, default=2100, help="joint steps of the independent attack")
    args = ap.parse_args()
    torch.set_num_threads(1)
    independent = _independent()
    data = load_data(DataConfig(source="digits"))
    mc = ModelConfig(arch="cnn", channels=[16, 32], fc=64)
    tc = TrainConfig(optimizer="sgd", lr=0.05, momentum=0.9, batch_size=64, steps=args.steps)
    print("| seed | ours SSIM | independent SSIM | difference | ours MSE | independent MSE | aux-mean SSIM | "
          "other-row SSIM (ours) | seconds (ours / independent) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for seed in [int(s) for s in args.seeds.split(",")]:
        private, aux = split_rows(len(data.x_train), 0.3, seed)
        run = _train(data, mc, "conv1", tc, InputProtectionConfig(), LabelProtectionConfig(method="marvell", scale=4),
                     private, aux[:100], seed)
        pick = torch.randperm(len(private), generator=torch.Generator().manual_seed(seed))[:256].sort().values
        x, received = data.x_train[private][pick], torch.stack([run.last[int(i)] for i in pick])
        aux_x, aux_y = data.x_train[aux], data.y_train[aux]

        def alice_like():
            return segment_of(build_model(mc, (1, 8, 8), 10), run.plan.owners["alice"], "alice")  # noqa: B023

        t0 = time.perf_counter()
        ours_hat = decoder_attack(alice_like, run.bob, aux_x, aux_y, received, True, seed=ATTACK_SEED + seed)
        t1 = time.perf_counter()
        theirs_hat = independent(alice_like, run.bob, aux_x, aux_y, received, args.independent_steps,
                                 ATTACK_SEED + seed + 1)
        t2 = time.perf_counter()
        ours, theirs = reconstruction_scores(x, ours_hat, True), reconstruction_scores(x, theirs_hat, True)
        ref = baselines(x, aux_x, ours_hat, True, seed=seed)
        print(f"| {seed} | {ours['ssim']:.3f} | {theirs['ssim']:.3f} | {ours['ssim'] - theirs['ssim']:+.3f} | "
              f"{ours['mse']:.4f} | {theirs['mse']:.4f} | {ref['mean_ssim']:.3f} | {ref['other_ssim']:.3f} | "
              f"{t1 - t0:.0f} / {t2 - t1:.0f} |", flush=True)


if __name__ == "__main__":
    main()
