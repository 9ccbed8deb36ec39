"""Choosing MNTD's meta-classifier settings without the evaluated models (issue 41, fifth round): k-fold cross-
validation over the *shadow* models only (train on k − 1 folds of shadows, score the held-out fold's shadows; ROC AUC
of backdoored vs clean held-out shadows). The evaluated models are never read here.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python -W ignore bench/backdoor_mntd_cv.py --shadows runs/bench/backdoor_mntd3/digits/shadows
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from modelward.backdoor.detect.model.mntd import MNTD
from modelward.backdoor.detect.model.shadows import train_shadows
from modelward.backdoor.experiment import box_of
from modelward.backdoor.study import BackdoorStudyConfig, run_config
from modelward.core.data import load_data


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    return float((pos[:, None] > neg[None]).mean() + 0.5 * (pos[:, None] == neg[None]).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--saved", default="runs/bench/backdoor_saved", help="the bench run whose config names the recipe")
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--shadows", required=True)
    ap.add_argument("--clean", type=int, default=64)
    ap.add_argument("--jumbo", type=int, default=160)
    ap.add_argument("--calibration", type=int, default=20)
    ap.add_argument("--seed", type=int, default=70_000)
    ap.add_argument("--folds", type=int, default=4)
    ap.add_argument("--variants", default="q10e100,q10e100x5,q5e100,q20e60")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    cfg = BackdoorStudyConfig.model_validate_json((Path(a.saved) / "config.json").read_text())
    rc = run_config(cfg, a.dataset, None, 0)
    data = load_data(rc.data)
    clip = box_of(data)
    ss = train_shadows(a.shadows, data, rc.model, rc.train, clip, a.clean, a.jumbo, a.calibration, a.seed)
    y = np.array(ss.labels)
    # which backdoored shadows are label-consistent (reported apart: the attack this round is about)
    jumbo = [r for k, r in sorted(ss.records.items(), key=lambda kv: (kv[0].split("-")[0], int(kv[0].split("-")[1])
                                                                     if "-" in kv[0] else 0))
             if k.startswith("jumbo") and r["asr"] >= 0.5]
    cl = np.zeros(len(y), bool)
    cl[np.flatnonzero(y == 1)] = [r["draw"]["clean_label"] for r in jumbo]
    fold = np.random.default_rng(0).permutation(len(y)) % a.folds
    res = {}
    for var in a.variants.split(","):
        q = int(var[1:var.index("e")])
        e = int(var[var.index("e") + 1:].split("x")[0])
        ens = int(var.split("x")[1]) if "x" in var else 1
        t0 = time.perf_counter()
        score = np.zeros(len(y))
        for f in range(a.folds):
            tr = np.flatnonzero(fold != f)
            te = np.flatnonzero(fold == f)
            s = np.zeros(len(te))
            for m in range(ens):
                det = MNTD(queries=q, epochs=e, seed=m).fit([ss.models[i] for i in tr], list(y[tr]), ss.calibration[:1],
                                                             data.input_shape, data.num_classes, clip)
                s += np.array([det.score(ss.models[i]) for i in te]) / ens
            score[te] = s
        res[var] = {"auc": auc(score[y == 1], score[y == 0]), "auc_clean_label": auc(score[cl], score[y == 0]),
                    "auc_dirty": auc(score[(y == 1) & ~cl], score[y == 0]), "seconds": time.perf_counter() - t0}
        print(var, json.dumps(res[var]), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"args": vars(a), "n": len(y), "backdoored": int(y.sum()),
                                           "clean_label": int(cl.sum()), "variants": res}, indent=1))


if __name__ == "__main__":
    main()
