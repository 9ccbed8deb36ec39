"""Why model-level detection misses the clean-label backdoor (issue 41, fourth round), on the saved bench models:
nothing is trained.

Per clean-label model (seeds 0–2 of each data set, ``--seeds``): the attack success rate with the real trigger; how
concentrated the trigger's effect is in the last convolutional block (the share of its mean activation increase on
other classes' clean images carried by the top 3 of its channels: ABS's premise is a few neurons); Neural Cleanse's
reversed mask for the target class (its L1 norm, its rank among the classes, and the share of its mass inside the
real trigger's pixels against the share of the image those pixels are). Then, from the ledgers, each model's
target-class z-score against the clean models of the other seeds (``CleanReference``, leave-one-out) for both
detectors, the clean models' largest z, the references' σ, and MM-BD's optimisation noise (two seeds of its random
starts on one clean digits model) against that σ.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python -W ignore bench/backdoor_clean_label_why.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from modelward.backdoor.attacks.base import backdoor_effect
from modelward.backdoor.detect.model.mmbd import MMBD
from modelward.backdoor.detect.model.neural_cleanse import NeuralCleanse
from modelward.backdoor.detect.model.reference import CleanReference
from modelward.backdoor.experiment import box_of, build_attack, defender_split
from modelward.backdoor.features import last_feature_map
from modelward.backdoor.study import BackdoorStudyConfig, run_config
from modelward.core.data import load_data
from modelward.core.ledger import RunLedger

sys.path.insert(0, str(Path(__file__).parent))
from backdoor_stimulation import load  # noqa: E402 - the bench scripts are not a package


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--saved", default="runs/backdoor_saved")
    ap.add_argument("--strong", default="runs/backdoor_rgb_strong")
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    runs = {"digits": Path(args.saved), "rgb": Path(args.strong)}
    for ds, run in runs.items():
        cfg = BackdoorStudyConfig.model_validate_json((run / "config.json").read_text())
        for seed in range(args.seeds):
            rid = f"{ds}|clean_label|{seed}"
            rc = run_config(cfg, ds, "clean_label", seed)
            data = load_data(rc.data)
            att = build_attack(rc.attack.model_copy(update={"surrogate_steps": 0}), data, rc.model, rc.train, seed)
            model, t = load(run, rid)
            (xd, yd), (xe, ye) = defender_split(data, seed)
            eff = backdoor_effect(model, att.apply, xe, ye, t)
            layer = dict(model.named_modules())[last_feature_map(model, xd)]
            acts: list[torch.Tensor] = []
            h = layer.register_forward_hook(lambda m, i, o, acts=acts: acts.append(o.detach()))
            xo = xd[yd != t][:100]
            with torch.no_grad():
                model(xo)
                model(att.apply(xo))
            h.remove()
            rise = (acts[1] - acts[0]).mean(0).clamp_min(0).flatten(1).sum(1)
            top3 = float(rise.sort(descending=True).values[:3].sum() / rise.sum())
            nc = NeuralCleanse(epochs=40, seed=seed, clip=box_of(data))
            v = nc.detect(model, xd[:200], data.num_classes)
            mask = nc.last.masks[t].reshape(-1, *data.input_shape[1:])[0]
            z = torch.full((1, *data.input_shape), 0.123)
            region = (att.apply(z) != z).any(1)[0]
            print(f"{rid}: target {t}, ASR {eff.attack_success_rate:.2f}; top 3 of {len(rise)} channels carry "
                  f"{top3:.2f} of the trigger's activation increase; NC target mask L1 {v.per_class[t]:.1f} (rank "
                  f"{int((np.array(v.per_class) < v.per_class[t]).sum()) + 1} of {data.num_classes}, 1 = smallest), "
                  f"{float(mask[region].sum() / mask.sum()):.2f} of its mass on the trigger's {int(region.sum())} "
                  f"pixels ({float(region.float().mean()):.2f} of the image)", flush=True)
    ledgers = {ds: [r for r in RunLedger(run / "ledger.sqlite").results().values()
                    if isinstance(r, dict) and r.get("dataset") == ds] for ds, run in runs.items()}
    saved = [r for r in RunLedger(Path(args.saved) / "ledger.sqlite").results().values() if isinstance(r, dict)]
    for ds in runs:
        clean = {r["seed"]: r for r in saved if r.get("dataset") == ds and r.get("attack") == "clean"}
        cl = sorted((r for r in ledgers[ds] if r.get("attack") == "clean_label"), key=lambda r: r["seed"])
        for det in ("neural_cleanse", "mmbd"):
            tz, rank, cz = [], [], []
            for r in cl:
                cal = CleanReference(det, [c[det]["per_class"] for s, c in clean.items() if s != r["seed"]])
                zs = cal.z_scores(r[det]["per_class"])
                tz.append(f"{zs[r['target']]:.1f}")
                rank.append(int((zs > zs[r["target"]]).sum()) + 1)
            for s, c in clean.items():
                cal = CleanReference(det, [c2[det]["per_class"] for s2, c2 in clean.items() if s2 != s])
                cz.append(f"{cal.z_scores(c[det]['per_class']).max():.1f}")
            sigma = CleanReference(det, [c[det]["per_class"] for c in clean.values()]).sigma
            print(f"{ds} {det}: clean-label target z {' '.join(tz)}; its rank {rank}; clean models' largest z "
                  f"{' '.join(cz)}; σ (log scale) {sigma:.3f}", flush=True)
    data = load_data(run_config(BackdoorStudyConfig.model_validate_json((Path(args.saved) / "config.json")
                                                                        .read_text()), "digits", None, 0).data)
    model, _ = load(Path(args.saved), "digits|clean|0")
    logs = [np.log(MMBD(seed=s, clip=box_of(data)).detect(model, data.input_shape, data.num_classes).per_class)
            for s in (0, 1)]
    print(f"MM-BD optimisation noise (digits clean 0, 30 starts × 300 steps, two seeds): sd per run "
          f"{float(np.sqrt(np.mean((logs[0] - logs[1]) ** 2) / 2)):.4f} on the log margin", flush=True)


if __name__ == "__main__":
    main()
