"""Model-level detection calibrated against clean reference models, class by class
(``modelward.backdoor.detect.model.reference.CleanReference``), on the per-class statistics the bench
(bench/backdoor_detection.py) stored in its ledgers: nothing is retrained or re-detected.

The reference models are always disjoint from the models evaluated (no test-on-train):

- ``calibration``: references = the clean calibration models (seeds 100, 101, ...; ``<run>/calibration``, the first
  ``--refs`` of them); evaluated = the study's clean models (seeds 0–9) and every backdoored model;
- ``swapped``: references = the study's clean models (the first ``--refs``); evaluated = the calibration models as
  the clean group, and every backdoored model.

A detector flags a model when its calibrated p < ``--alpha``; "either" flags at ``alpha / 2`` per detector
(Bonferroni: the combined verdict's false-positive rate stays ≤ alpha). A backdoored model counts as *effective* when
its attack success rate is ≥ 0.5 (the others are failed attacks, reported apart). Writes ``<out>/reference.{json,md}``.

    .venv/bin/python bench/backdoor_reference.py --run runs/bench/backdoor --out runs/bench/backdoor_reference
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from modelward.backdoor.detect.model.base import ModelVerdict
from modelward.backdoor.detect.model.reference import CleanReference
from modelward.core.ledger import RunLedger

DETECTORS = ("neural_cleanse", "mmbd")


def results(ledger: Path) -> list[dict[str, Any]]:
    return [r for r in RunLedger(ledger).results().values() if isinstance(r, dict) and "dataset" in r]


def verdict(r: dict[str, Any], d: str) -> ModelVerdict:
    v = r[d]
    return ModelVerdict(d, v["statistic"], 0.0, v["flagged"], v["suspect"], v["per_class"], v.get("p_value"))


def evaluate(refs: list[dict[str, Any]], clean: list[dict[str, Any]], backdoored: list[dict[str, Any]],
             alpha: float) -> list[dict[str, Any]]:
    rows = []
    for ds in sorted({r["dataset"] for r in clean}):
        cal = {d: CleanReference(d, [r[d]["per_class"] for r in refs if r["dataset"] == ds], alpha) for d in DETECTORS}
        groups = {"clean": [r for r in clean if r["dataset"] == ds]}
        for r in backdoored:
            if r["dataset"] == ds:
                groups.setdefault(r["attack"], []).append(r)
        for attack, rs in groups.items():
            row: dict[str, Any] = {"dataset": ds, "models": attack, "n": len(rs),
                                   "references": len(cal["mmbd"].reference)}
            flags, either, target, eff, eff_found, paper = {d: 0 for d in DETECTORS}, 0, 0, 0, 0, 0
            for r in rs:
                ps = {d: cal[d].p_value(r[d]["per_class"]) for d in DETECTORS}
                for d in DETECTORS:
                    flags[d] += ps[d][0] < alpha
                hit = [d for d in DETECTORS if ps[d][0] < alpha / 2]
                either += bool(hit)
                target += any(ps[d][1] == r.get("target") for d in hit)
                paper += any(r[d]["flagged"] for d in DETECTORS)
                if r.get("asr", 0.0) >= 0.5:
                    eff += 1
                    eff_found += bool(hit)
            row.update({f"{d}_flagged": flags[d] for d in DETECTORS})
            row.update({"either_flagged": either, "either_on_target": target, "papers_thresholds_either": paper})
            if attack != "clean":
                row.update({"effective": eff, "effective_flagged": eff_found})
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="runs/bench/backdoor", help="the --out folder of bench/backdoor_detection.py")
    ap.add_argument("--out", default="runs/bench/backdoor_reference")
    ap.add_argument("--refs", type=int, default=10, help="reference models used (the first N)")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--backdoored", default=None, metavar="RUN2",
                    help="take the backdoored models from RUN2's ledger instead (a run with --set-attack of the same "
                         "data sets, model and training; its clean models are ignored)")
    a = ap.parse_args()
    run, out = Path(a.run), Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    main_rs, cal_rs = results(run / "ledger.sqlite"), results(run / "calibration" / "ledger.sqlite")
    study_clean = sorted((r for r in main_rs if not r["backdoored"]), key=lambda r: r["seed"])
    cal_clean = sorted((r for r in cal_rs if not r["backdoored"]), key=lambda r: r["seed"])
    bd_rs = results(Path(a.backdoored) / "ledger.sqlite") if a.backdoored else main_rs
    backdoored = [r for r in bd_rs if r["backdoored"]]

    def first(rs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for ds in sorted({x["dataset"] for x in rs}) for r in [x for x in rs if x["dataset"] == ds][: a.refs]]

    tables = {"calibration": evaluate(first(cal_clean), study_clean, backdoored, a.alpha),
              "swapped": evaluate(first(study_clean), cal_clean, backdoored, a.alpha)}
    (out / "reference.json").write_text(json.dumps({"alpha": a.alpha, "refs": a.refs, **tables}, indent=1))
    lines = []
    for scheme, rows in tables.items():
        lines += [f"\n## references: {scheme} ({a.refs} per data set), alpha {a.alpha} (either: {a.alpha / 2} each)\n",
                  "| data | models | NC flagged | MM-BD flagged | either flagged (on target) | papers' thresholds, "
                  "either | effective (ASR ≥ 0.5): flagged |", "|---|---|---|---|---|---|---|"]
        for r in rows:
            eff = f"{r['effective_flagged']}/{r['effective']}" if "effective" in r else "–"
            lines.append(f"| {r['dataset']} | {r['models']} | {r['neural_cleanse_flagged']}/{r['n']} | "
                         f"{r['mmbd_flagged']}/{r['n']} | {r['either_flagged']}/{r['n']} ({r['either_on_target']}) | "
                         f"{r['papers_thresholds_either']}/{r['n']} | {eff} |")
    (out / "reference.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
