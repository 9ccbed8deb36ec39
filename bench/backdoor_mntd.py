"""MNTD (meta neural trojan detection, Xu et al., S&P 2021) on the bench's saved models (issue 41, fifth round): is
the clean-label backdoor, which Neural Cleanse and MM-BD miss, found by a meta-classifier trained on jumbo shadows?

Per data set: shadows trained with the bench's architecture and recipe on the data's training split
(``modelward.backdoor.detect.model.shadows``: clean, jumbo-backdoored with randomly drawn triggers, rates, targets and
label modes, and clean calibration shadows; seeds from ``--seed`` = 70 000 on, disjoint from every evaluated model's
seed 0–9 / 100–109 and their surrogates 10 000–10 009), the meta-classifier fitted on them, then every saved model of
the earlier rounds scored (none of them was seen in training). Flagged at the conformal p < ``--alpha`` against the
calibration shadows. The union with the clean-reference rule of Neural Cleanse / MM-BD (bench/backdoor_reference.py,
split A: references = calibration models 100–109, evaluated = clean models 0–9) is measured model by model, clean
models included.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python -W ignore bench/backdoor_mntd.py --out runs/bench/backdoor_mntd
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.stats import beta

from modelward.backdoor.detect.model.mntd import JUMBO_VERSION, MNTD
from modelward.backdoor.detect.model.reference import CleanReference
from modelward.backdoor.detect.model.shadows import describe, fingerprint, reuse_clean_shadows, train_shadows
from modelward.backdoor.experiment import box_of, train_backdoored
from modelward.backdoor.study import BackdoorStudyConfig, run_config, run_folder
from modelward.core.data import load_data
from modelward.core.io import load_state_dict, save_state_dict
from modelward.core.ledger import RunLedger
from modelward.core.progress import LoggingProgress
from modelward.core.zoo import build_model

ATTACKS = ("badnets", "blend", "wanet", "clean_label")
DETECTORS = ("neural_cleanse", "mmbd")


def cp(k: int, n: int, conf: float = 0.95) -> tuple[float, float]:
    """Clopper–Pearson interval of k successes in n."""
    a = (1 - conf) / 2
    lo = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def ledger_rows(path: Path) -> dict[str, dict[str, Any]]:
    return {k: r for k, r in RunLedger(path).results().items() if isinstance(r, dict) and "dataset" in r}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--saved", default="runs/bench/backdoor_saved", help="round 3's bench run (models/, ledgers)")
    ap.add_argument("--strong", default="runs/bench/backdoor_rgb_strong", help="its rgb WaNet 10 % / clean-label 5×5")
    ap.add_argument("--datasets", default="digits,rgb")
    ap.add_argument("--clean", type=int, default=32)
    ap.add_argument("--jumbo", type=int, default=48)
    ap.add_argument("--calibration", type=int, default=20)
    ap.add_argument("--clean-label-share", type=float, default=0.5)
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--queries", type=int, default=10)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=70_000)
    ap.add_argument("--meta-seed", type=int, default=0)
    ap.add_argument("--extra-clean-seeds", default="100-109",
                    help="clean models of these seeds (the bench's calibration seeds) trained and scored too ('' none)")
    ap.add_argument("--jumbo-version", type=int, default=JUMBO_VERSION, help="2: uniform patterns only (first run)")
    ap.add_argument("--reuse-clean", default=None, metavar="OUT",
                    help="take the clean, calibration and surrogate shadows of an earlier --out (same recipe)")
    ap.add_argument("--out", default="runs/bench/backdoor_mntd")
    a = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    saved, strong = Path(a.saved), Path(a.strong)
    cfg = BackdoorStudyConfig.model_validate_json((saved / "config.json").read_text())
    main_rows, cal_rows = ledger_rows(saved / "ledger.sqlite"), ledger_rows(saved / "calibration" / "ledger.sqlite")
    strong_rows = ledger_rows(strong / "ledger.sqlite")
    report: dict[str, Any] = {"args": vars(a), "datasets": {}}
    lines = []
    for ds in a.datasets.split(","):
        rc = run_config(cfg, ds, None, 0)
        data = load_data(rc.data)
        clip = box_of(data)
        t0 = time.perf_counter()
        if a.reuse_clean:
            reuse_clean_shadows(Path(a.reuse_clean) / ds / "shadows", out / ds / "shadows",
                                fingerprint(data, rc.model, rc.train, clip, a.seed, a.clean_label_share,
                                            a.jumbo_version))
        ss = train_shadows(out / ds / "shadows", data, rc.model, rc.train, clip, a.clean, a.jumbo, a.calibration,
                           a.seed, a.clean_label_share, progress=LoggingProgress(out / ds / "progress.log"),
                           jumbo_version=a.jumbo_version)
        t_sh = time.perf_counter() - t0
        det = MNTD(queries=a.queries, epochs=a.epochs, alpha=a.alpha, seed=a.meta_seed)
        det.fit(ss.models, ss.labels, ss.calibration, data.input_shape, data.num_classes, clip)
        det.save(out / ds / "mntd.safetensors", {"dataset": ds})
        # the references of split A: the clean calibration models' per-class statistics (seeds 100–109)
        refs = {d: CleanReference(d, [r[d]["per_class"] for r in cal_rows.values() if r["dataset"] == ds
                                      and not r["backdoored"]], a.alpha) for d in DETECTORS}
        groups: dict[str, list[dict[str, Any]]] = {}
        for rid, r in sorted(main_rows.items(), key=lambda kv: (kv[1]["attack"] or "", kv[1]["seed"])):
            if r["dataset"] != ds:
                continue
            att = r["attack"] or "clean"
            src = strong if (ds == "rgb" and att in ("wanet", "clean_label")) else saved
            row = strong_rows.get(rid, r) if src is strong else r
            model = build_model(rc.model, data.input_shape, data.num_classes)
            model.load_state_dict(load_state_dict(run_folder(src, rid) / "model.safetensors")[0])
            v = det.detect(model.eval())
            ps = {d: refs[d].p_value(row[d]["per_class"])[0] for d in DETECTORS}
            either = any(ps[d] < a.alpha / 2 for d in DETECTORS)
            groups.setdefault(att, []).append({
                "run": rid, "seed": r["seed"], "asr": row.get("asr"), "mntd_score": v.extra["score"],
                "mntd_p": v.p_value, "mntd": bool(v.backdoored), "ref_either": either,
                "ref_p": ps, "union": bool(v.backdoored) or either})
        if a.extra_clean_seeds:
            # split B's clean group: the calibration seeds retrained (deterministic on one machine: the same models
            # whose Neural Cleanse / MM-BD statistics the calibration ledger holds), tested against references = the
            # study's clean models 0–9
            refs_b = {d: CleanReference(d, [r[d]["per_class"] for r in main_rows.values() if r["dataset"] == ds
                                            and not r["backdoored"]], a.alpha) for d in DETECTORS}
            lo, hi = map(int, a.extra_clean_seeds.split("-"))
            for s in range(lo, hi + 1):
                rid = f"{ds}|clean|{s}"
                f = out / "clean_models" / f"{ds}_clean_{s}.safetensors"
                if f.is_file():
                    model = build_model(rc.model, data.input_shape, data.num_classes)
                    model.load_state_dict(load_state_dict(f)[0])
                else:
                    model = train_backdoored(run_config(cfg, ds, None, s), data).model
                    f.parent.mkdir(parents=True, exist_ok=True)
                    save_state_dict(f, {k: v.cpu() for k, v in model.state_dict().items()})
                v = det.detect(model.eval())
                row = cal_rows.get(rid)
                rec: dict[str, Any] = {"run": rid, "seed": s, "asr": None, "mntd_score": v.extra["score"],
                                       "mntd_p": v.p_value, "mntd": bool(v.backdoored)}
                if row is not None:
                    ps = {d: refs_b[d].p_value(row[d]["per_class"])[0] for d in DETECTORS}
                    either = any(ps[d] < a.alpha / 2 for d in DETECTORS)
                    rec.update({"ref_p": ps, "ref_either": either, "union": bool(v.backdoored) or either})
                groups.setdefault("clean_extra", []).append(rec)
        summary = []
        for att, rs in groups.items():
            eff = [r for r in rs if att in ("clean", "clean_extra") or (r["asr"] or 0) >= 0.5]
            row: dict[str, Any] = {"models": att, "n": len(eff), "failed_attacks": len(rs) - len(eff)}
            for key in ("mntd", "ref_either", "union"):
                if all(key in r for r in eff):
                    k = sum(r[key] for r in eff)
                    row[key] = k
                    row[key + "_ci"] = cp(k, len(eff))
            summary.append(row)
        # ROC AUC of the MNTD score: each attack's effective models against the clean ones
        clean_s = np.array([r["mntd_score"] for r in groups.get("clean", [])])
        for row in summary:
            if row["models"] in ("clean", "clean_extra") or not len(clean_s):
                continue
            s = np.array([r["mntd_score"] for r in groups[row["models"]] if (r["asr"] or 0) >= 0.5])
            row["auc"] = float((s[:, None] > clean_s[None]).mean() + 0.5 * (s[:, None] == clean_s[None]).mean())
        report["datasets"][ds] = {"shadows": describe(ss.records), "shadow_seconds": t_sh, "meta": det.info,
                                  "calibration_scores": det.calibration_scores.tolist(), "summary": summary,
                                  "models": groups}
        lines += [f"\n## {ds}: MNTD ({len(ss.labels)} meta-training shadows, {sum(ss.labels)} backdoored; "
                  f"{len(ss.calibration)} calibration), alpha {a.alpha}; shadows {describe(ss.records)}\n",
                  "| models | n (failed apart) | MNTD flagged [95 % CI] | NC/MM-BD ref. (split A) | union | MNTD AUC |",
                  "|---|---|---|---|---|---|"]
        for r in summary:
            def f(key: str, r: dict[str, Any] = r) -> str:
                if key not in r:
                    return "–"
                lo, hi = r[key + "_ci"]
                return f"{r[key]}/{r['n']} [{lo:.2f}, {hi:.2f}]"
            lines.append(f"| {r['models']} | {r['n']} ({r['failed_attacks']}) | {f('mntd')} | {f('ref_either')} | "
                         f"{f('union')} | {r.get('auc', float('nan')):.3f} |")
        print("\n".join(lines[-len(summary) - 3:]), flush=True)
    (out / "mntd.json").write_text(json.dumps(report, indent=1, default=float))
    (out / "mntd.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
