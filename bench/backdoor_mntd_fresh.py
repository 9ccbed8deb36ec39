"""MNTD on freshly seeded models (issue 41, fifth round): the jumbo distribution's version 3 (binary patterns) was
adopted after seeing the saved clean-label models' results, so it is checked here on models that played no part in
that choice — clean-label and clean digits models of new seeds (``--seeds``, default 200–209; targets seed mod 10),
with the bench's recipe and attack settings, scored by the saved meta-classifiers of ``--meta`` (no retraining).

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python -W ignore bench/backdoor_mntd_fresh.py \\
        --meta runs/bench/backdoor_mntd_v3/digits/mntd.safetensors,runs/bench/backdoor_mntd3/digits/mntd.safetensors
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from modelward.backdoor.detect.model.mntd import MNTD
from modelward.backdoor.detect.model.reference import CleanReference
from modelward.backdoor.experiment import detect_model, train_backdoored
from modelward.backdoor.study import BackdoorStudyConfig, run_config
from modelward.core.data import load_data
from modelward.core.io import load_state_dict, save_state_dict
from modelward.core.ledger import RunLedger
from modelward.core.zoo import build_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--saved", default="runs/bench/backdoor_saved", help="the bench run whose config is the recipe")
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--attack", default="clean_label")
    ap.add_argument("--seeds", default="200-209")
    ap.add_argument("--meta", required=True, help="comma-separated mntd.safetensors files")
    ap.add_argument("--union", action="store_true",
                    help="also Neural Cleanse and MM-BD (the bench's settings) against the 10 calibration models "
                         "(split A's references), p < 0.025 each, for the union with MNTD")
    ap.add_argument("--calibration", default=None, help="the calibration run of --union's references (default: "
                    "<saved>/calibration; the rgb study of the third round keeps its own in the first round's run)")
    ap.add_argument("--out", default="runs/bench/backdoor_mntd_fresh")
    a = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = BackdoorStudyConfig.model_validate_json((Path(a.saved) / "config.json").read_text())
    lo, hi = map(int, a.seeds.split("-"))
    dets = {m: MNTD.load(m) for m in a.meta.split(",")}
    rows: list[dict[str, Any]] = []
    refs = {}
    if a.union:
        cal_run = Path(a.calibration) if a.calibration else Path(a.saved) / "calibration"
        cal = [r for r in RunLedger(cal_run / "ledger.sqlite").results().values()
               if isinstance(r, dict) and r.get("dataset") == a.dataset]
        refs = {d: CleanReference(d, [r[d]["per_class"] for r in cal], 0.05) for d in ("neural_cleanse", "mmbd")}
    for att in (a.attack, None):
        for s in range(lo, hi + 1):
            rc = run_config(cfg, a.dataset, att, s)
            data = load_data(rc.data)
            f = out / f"{a.dataset}_{att or 'clean'}_{s}.safetensors"
            fj = f.with_suffix(".json")
            if f.is_file():
                model = build_model(rc.model, data.input_shape, data.num_classes)
                model.load_state_dict(load_state_dict(f)[0])
                asr = json.loads(fj.read_text())["asr"]
            else:
                t = train_backdoored(rc, data)
                model, asr = t.model, (t.effect.attack_success_rate if t.effect else None)
                save_state_dict(f, {k: v.cpu() for k, v in model.state_dict().items()})
                fj.write_text(json.dumps({"asr": asr}))
            r = {"models": att or "clean", "seed": s, "asr": asr}
            for m, det in dets.items():
                v = det.detect(model.eval())
                r[m] = {"score": v.extra["score"], "p": v.p_value, "flagged": bool(v.backdoored)}
            if refs:
                vs, _ = detect_model(model, data, cfg.detect, s)
                r["ref_p"] = {v.detector: refs[v.detector].p_value(v.per_class)[0] for v in vs if v.detector in refs}
                r["ref_either"] = any(p < 0.025 for p in r["ref_p"].values())
            rows.append(r)
            print(json.dumps(r), flush=True)
    lines = ["| meta-classifier | models | n (ASR ≥ 0.5) | flagged |", "|---|---|---|---|"]
    for m in dets:
        for g in (a.attack, "clean"):
            rs = [r for r in rows if r["models"] == g and (g == "clean" or (r["asr"] or 0) >= 0.5)]
            union = (f"; NC/MM-BD ref. {sum(r['ref_either'] for r in rs)}, union "
                     f"{sum(r['ref_either'] or r[m]['flagged'] for r in rs)}" if refs else "")
            lines.append(f"| {m} | {g} | {len(rs)} | {sum(r[m]['flagged'] for r in rs)}{union} |")
    (out / "fresh.json").write_text(json.dumps(rows, indent=1))
    (out / "fresh.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
