"""The BatchNorm-shift detector (issue 41, sixth round) on every saved and freshly seeded model, alone and in the
union with Neural Cleanse / MM-BD against clean references.

`BatchNormShift` (library defaults: 500 simulated clean runs, batch size 64, the first 200 of the defender's clean
half, seeded by the model's seed) reads each model's BatchNorm running statistics against the defender's clean data
(``src/modelward/backdoor/detect/model/bn_shift.py``). Models (nothing retrained here):

- the third round's saved models (``--saved``: digits and rgb, clean / BadNets / Blend / WaNet / clean-label, seeds
  0–9; rgb clean-label with 5×5 corners and rgb WaNet at 10 % from ``--strong``);
- the fifth round's freshly seeded digits models (``--fresh-digits``: clean-label and clean, seeds 200–229);
- freshly seeded rgb models (``--fresh-rgb``: clean-label 5×5 and clean, seeds 200–219), trained for this round by
  ``bench/backdoor_mntd_fresh.py --saved <strong> --dataset rgb --seeds 200-219`` (its MNTD scores not used here).

Union (fixed before it was computed): flagged when any of Neural Cleanse and MM-BD against clean references (split
A: the calibration models of seeds 100–109; Šidák over classes) and the BN shift has p < 0.05 / 3. The fresh
models' Neural Cleanse / MM-BD p-values are read from their ``fresh.json`` (``backdoor_mntd_fresh.py --union``; rgb:
``--calibration runs/bench/backdoor_saved/calibration``); without them the union column is the BN shift's alone.
Backdoored = attack success ≥ 0.5 (others counted apart). Intervals: Clopper–Pearson 95 %.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python -W ignore bench/backdoor_bn_shift.py --out runs/bench/backdoor_bn_shift
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.stats import beta

sys.path.insert(0, str(Path(__file__).parent))
from backdoor_stimulation import DATA  # noqa: E402

from modelward.backdoor.detect.data.base import roc_auc  # noqa: E402
from modelward.backdoor.detect.model.bn_shift import BatchNormShift  # noqa: E402
from modelward.backdoor.detect.model.reference import CleanReference  # noqa: E402
from modelward.backdoor.experiment import defender_split  # noqa: E402
from modelward.backdoor.study import BackdoorStudyConfig, run_config, run_folder  # noqa: E402
from modelward.core.data import load_data  # noqa: E402
from modelward.core.io import load_state_dict  # noqa: E402
from modelward.core.ledger import RunLedger  # noqa: E402
from modelward.core.zoo import build_model  # noqa: E402

ATTACKS = ("clean_label", "badnets", "blend", "wanet")


def interval(k: int, n: int) -> str:
    lo = beta.ppf(0.025, k, n - k + 1) if k > 0 else 0.0
    hi = beta.ppf(0.975, k + 1, n - k) if k < n else 1.0
    return f"[{lo:.2f}, {hi:.2f}]"


def models(a: argparse.Namespace) -> list[dict[str, Any]]:
    """Every model: key, weights, dataset, group, seed, config run (for the recipe), ASR, reference p-values."""
    saved, strong = Path(a.saved), Path(a.strong)
    led = {r: RunLedger(r / "ledger.sqlite").results() for r in (saved, strong)}
    cal = RunLedger(saved / "calibration" / "ledger.sqlite").results()
    refs = {(ds, d): CleanReference(d, [v[d]["per_class"] for k, v in cal.items() if k.startswith(ds + "|")], 0.05)
            for ds in ("digits", "rgb") for d in ("neural_cleanse", "mmbd")}
    out = []
    for ds in ("digits", "rgb"):
        for g in ("clean", *ATTACKS):
            run = strong if ds == "rgb" and g in ("clean_label", "wanet") else saved
            for s in range(10):
                rid = f"{ds}|{g}|{s}"
                r = led[run][rid]
                out.append({"key": f"saved|{rid}", "file": run_folder(run, rid) / "model.safetensors", "ds": ds,
                            "group": g, "seed": s, "run": run, "asr": r.get("asr"),
                            "ref_p": {d: refs[(ds, d)].p_value(r[d]["per_class"])[0] for d in ("neural_cleanse", "mmbd")}})
    for folder, ds, run in ((a.fresh_digits, "digits", saved), (a.fresh_rgb, "rgb", strong)):
        for f in [Path(x) for x in folder.split(",") if x]:
            rows = json.loads((f / "fresh.json").read_text()) if (f / "fresh.json").is_file() else []
            ref = {(r["models"], r["seed"]): r.get("ref_p") for r in rows}
            for w in sorted(f.glob(f"{ds}_*.safetensors")):
                g, s = w.stem[len(ds) + 1:].rsplit("_", 1)
                asr = json.loads(w.with_suffix(".json").read_text())["asr"]
                out.append({"key": f"fresh|{ds}|{g}|{s}", "file": w, "ds": ds, "group": g, "seed": int(s),
                            "run": run, "asr": asr, "ref_p": ref.get((g, int(s)))})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--saved", default="runs/bench/backdoor_saved")
    ap.add_argument("--strong", default="runs/bench/backdoor_rgb_strong")
    ap.add_argument("--fresh-digits", default="runs/bench/backdoor_mntd_fresh,runs/bench/backdoor_mntd_fresh2")
    ap.add_argument("--fresh-rgb", default="runs/bench/backdoor_fresh_rgb")
    ap.add_argument("--points", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=64, help="the training batch size the null assumes (the "
                    "models were trained with 64: other values measure the null's sensitivity to that assumption)")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--out", default="runs/bench/backdoor_bn_shift")
    a = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = out / "verdicts.json"  # per model: an interrupted run resumes
    done: dict[str, Any] = json.loads(cache.read_text()) if cache.is_file() else {}
    datas = {ds: load_data(DATA[ds]) for ds in ("digits", "rgb")}
    cfgs: dict[Path, BackdoorStudyConfig] = {}
    rows = models(a)
    for m in rows:
        if m["key"] in done:
            continue
        cfg = cfgs.setdefault(m["run"], BackdoorStudyConfig.model_validate_json((m["run"] / "config.json").read_text()))
        rc = run_config(cfg, m["ds"], None if m["group"] == "clean" else m["group"], m["seed"])
        data = datas[m["ds"]]
        model = build_model(rc.model, data.input_shape, data.num_classes)
        model.load_state_dict(load_state_dict(m["file"])[0])
        (xd, _), _ = defender_split(data, m["seed"])
        t0 = time.perf_counter()
        v = BatchNormShift(batch_size=a.batch_size, seed=m["seed"]).detect(model.eval(), xd[: a.points], data.num_classes)
        done[m["key"]] = {"p": v.p_value, "suspect": v.suspect_class, "seconds": time.perf_counter() - t0,
                          "target": rc.attack.target if rc.attack is not None else None,
                          "layers": [(lay["divergence"], lay["p_value"], lay["null_q95"]) for lay in v.extra["layers"]]}
        cache.write_text(json.dumps(done))
        print(m["key"], f"p {v.p_value:.4f} suspect {v.suspect_class} target {done[m['key']]['target']}",
              f"{done[m['key']]['seconds']:.1f}s", flush=True)
    table = ["| data | models | n (ASR ≥ 0.5) | BN shift, p < 0.05 (on target) | BN shift ROC AUC vs clean | "
             "NC / MM-BD with references, p < 0.05/3 each | **union**, each at 0.05/3 |", "|---|---|---|---|---|---|---|"]
    summary = []
    for src in ("saved", "fresh"):
        for ds in ("digits", "rgb"):
            for g in ("clean", *ATTACKS):
                sel = [m for m in rows if m["key"].startswith(f"{src}|{ds}|{g}|")
                       and (g == "clean" or (m["asr"] or 0) >= 0.5)]
                if not sel:
                    continue
                clean = [done[m["key"]]["p"] for m in rows if m["key"].startswith(f"{src}|{ds}|clean|")]
                ps = [done[m["key"]]["p"] for m in sel]
                bn = sum(p < a.alpha for p in ps)
                on = sum(done[m["key"]]["p"] < a.alpha and done[m["key"]]["suspect"] == done[m["key"]]["target"]
                         for m in sel)
                have_ref = all(m["ref_p"] for m in sel)
                ref = sum(min(m["ref_p"].values()) < a.alpha / 3 for m in sel) if have_ref else None
                union = sum(done[m["key"]]["p"] < a.alpha / 3 or (have_ref and min(m["ref_p"].values()) < a.alpha / 3)
                            for m in sel)
                auc = (roc_auc(-np.log(np.asarray(ps + clean)), np.r_[np.ones(len(ps)), np.zeros(len(clean))].astype(bool))
                       if g != "clean" else None)
                n = len(sel)
                summary.append({"models": src, "dataset": ds, "group": g, "n": n, "bn_flagged": bn, "bn_on_target": on,
                                "auc": auc, "ref_flagged": ref, "union": union, "union_interval": interval(union, n)})
                table.append(f"| {ds} ({src}) | {g} | {n} | {bn}/{n} ({on if g != 'clean' else '–'}) | "
                             f"{'–' if auc is None else f'{auc:.2f}'} | {'–' if ref is None else f'{ref}/{n}'} | "
                             f"**{union}/{n}** {interval(union, n)} |")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main()
