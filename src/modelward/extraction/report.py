"""The extraction evaluation's report (seed 003 Tables 2–5 layout, Fig. 3 sweep, Fig. 5 right), built from the
cells' results: ``results.csv`` (one row per cell), ``worst_case.csv`` (per defense, the maximum over attacks),
``results.md``, ``accuracy_vs_epsilon.png`` and ``centroids_vs_queries.png`` (+ ``centroids.csv``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from modelward.core.plots import line_plot
from modelward.core.records import write_csv, write_table
from modelward.core.stats import Summary, mean_sd_text, summarize
from modelward.extraction.config import Cell, ExtractionConfig
from modelward.extraction.prepare import Prepared

COLUMNS = ["defense", "epsilon", "attack", "query", "strategy", "seed", "accuracy", "fidelity", "best_epoch",
           "max_l1", "mean_l1", "protected_accuracy", "recovery_distance", "queries_used", "n_train", "centroids",
           "cell_seconds"]
WORST_CASE_COLUMNS = ["defense", "max_accuracy", "worst_attack", "max_fidelity", "max_l1", "protected_accuracy",
                      "attacks"]


def row(cell: Cell, res: dict[str, Any]) -> dict[str, Any]:
    """The results.csv row of a cell's result."""
    row = {"defense": cell.defense_key, "epsilon": cell.epsilon, "attack": cell.attack.key,
           "query": cell.attack.query, "strategy": cell.attack.strategy, "seed": cell.seed}
    row.update({k: res.get(k) for k in COLUMNS if k not in row})
    return row


def aggregate(rows: list[dict[str, Any]]) -> tuple[list[str], list[str], dict[tuple[str, str], dict[str, float]]]:
    """Mean over seeds per (attack, defense); returns (attack order, defense order, cell means)."""
    attacks = list(dict.fromkeys(r["attack"] for r in rows))
    defenses = list(dict.fromkeys(r["defense"] for r in rows))
    means: dict[tuple[str, str], dict[str, float]] = {}
    for a in attacks:
        for d in defenses:
            rs = [r for r in rows if r["attack"] == a and r["defense"] == d]
            if rs:
                means[(a, d)] = {k: summarize([r[k] for r in rs], skip_missing=True).mean for k in
                                 ("accuracy", "fidelity", "max_l1", "protected_accuracy", "recovery_distance")}
                means[(a, d)]["n"] = len(rs)
                means[(a, d)]["accuracy_sd"] = summarize([r["accuracy"] for r in rs]).sd
    return attacks, defenses, means


def worst_case(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per defense: max over attacks of extraction accuracy and fidelity, max ℓ1, protected accuracy."""
    attacks, defenses, means = aggregate(rows)
    out = []
    for d in defenses:
        ms = {a: means[(a, d)] for a in attacks if (a, d) in means}
        best = max(ms, key=lambda a: ms[a]["accuracy"])
        out.append({"defense": d, "max_accuracy": ms[best]["accuracy"], "worst_attack": best,
                    "max_fidelity": max(m["fidelity"] for m in ms.values()),
                    "max_l1": max((m["max_l1"] for m in ms.values() if not math.isnan(m["max_l1"])),
                                  default=float("nan")),
                    "protected_accuracy": summarize([m["protected_accuracy"] for m in ms.values()],
                                                    skip_missing=True).mean,
                    "attacks": len(ms)})
    return out


def _pct(v: float) -> str:
    return "—" if v is None or math.isnan(v) else f"{100 * v:.2f}%"


def _cell(m: dict[str, float]) -> str:
    """Mean accuracy, with ± the SD over seeds (n − 1) when there are several."""
    s = Summary(math.nan, m["accuracy"], m.get("accuracy_sd", math.nan), math.nan, math.nan, int(m["n"]))
    return mean_sd_text(s, 2, sd_digits=1, scale=100.0, unit="%")


def write_report(cfg: ExtractionConfig, rows: list[dict[str, Any]], prep: Prepared,
                 curves: dict[str, tuple[list[int], list[int]]], out: Path) -> dict[str, Any]:
    wc = worst_case(rows) if rows else []
    write_table(out, "worst_case", wc, WORST_CASE_COLUMNS, title=f"{cfg.name}: worst case over attacks")
    attacks, defenses, means = aggregate(rows) if rows else ([], [], {})
    md = [f"# {cfg.name}: extraction accuracy of the substitute", "",
          f"Victim: {cfg.data.source}, {cfg.victim.model.arch}, T = {cfg.victim.temperature:g}, test accuracy "
          f"{_pct(prep.victim_accuracy)}; transfer pool: {cfg.transfer.source} ({len(prep.transfer)}); budget "
          f"{cfg.budget}; seeds {cfg.seeds} (mean ± SD over seeds where there are several).", ""]
    md.append("| Attack | " + " | ".join(defenses) + " |")
    md.append("|---|" + "---|" * len(defenses))
    for a in attacks:
        md.append(f"| {a} | " + " | ".join(_cell(means[(a, d)]) if (a, d) in means else "—"
                                           for d in defenses) + " |")
    wcd = {r["defense"]: r for r in wc}
    md.append("| **Max accuracy of w_s** | " + " | ".join(f"**{_pct(wcd[d]['max_accuracy'])}**" for d in defenses)
              + " |")
    md.append("| Max fidelity of w_s | " + " | ".join(_pct(wcd[d]["max_fidelity"]) for d in defenses) + " |")
    md.append("| Max ℓ1 distortion | " + " | ".join(
        "—" if math.isnan(wcd[d]["max_l1"]) else f"{wcd[d]['max_l1']:.2f}" for d in defenses) + " |")
    md.append("| Protected accuracy of w_t | " + " | ".join(_pct(wcd[d]["protected_accuracy"]) for d in defenses)
              + " |")
    partial = [d for d in defenses if wcd[d]["attacks"] < len(attacks)]
    if partial:
        md += ["", f"Columns {', '.join(partial)} ran a subset of the attacks (— cells); their max is over that "
               "subset."]
    if any(not math.isnan(m["recovery_distance"]) for m in means.values()):
        md += ["", "Mean recovery distance E‖ỹ − y‖₂ (lower = the attacker recovered the clean answers better):", "",
               "| Attack | " + " | ".join(defenses) + " |", "|---|" + "---|" * len(defenses)]
        for a in attacks:
            md.append(f"| {a} | " + " | ".join(
                f"{means[(a, d)]['recovery_distance']:.3f}" if (a, d) in means
                and not math.isnan(means[(a, d)]["recovery_distance"]) else "—" for d in defenses) + " |")
    if curves:
        md += ["", "ModelGuard-S centroids after N queries: " + "; ".join(
            f"{k}: {v[1][-1]} after {v[0][-1]}" for k, v in curves.items())]
    write_table(out, "results", rows, COLUMNS, markdown="\n".join(md) + "\n")

    # accuracy vs ε: one line per (defense, attack) with at least two ε values (across [[defenses]] entries)
    series: dict[str, tuple[list[float], list[float]]] = {}
    bases = list(dict.fromkeys(d.label or d.name for d in cfg.defenses))
    eps_of = {b: sorted({e for d in cfg.defenses if (d.label or d.name) == b for e in d.epsilons}) for b in bases}
    for base in bases:
        for a in attacks:
            pts = [(e, means[(a, f"{base}@{e:g}")]["accuracy"]) for e in eps_of[base]
                   if (a, f"{base}@{e:g}") in means]
            if len(pts) >= 2:
                series[f"{base} / {a}"] = ([p[0] for p in pts], [p[1] for p in pts])
    if series:
        line_plot(out / "accuracy_vs_epsilon.png", series, f"{cfg.name}: extraction accuracy vs ε", "ε (ℓ1 budget)",
                  "extraction accuracy")
    if curves:
        line_plot(out / "centroids_vs_queries.png", {k: (v[0], v[1]) for k, v in curves.items()},
                  f"{cfg.name}: ModelGuard-S centroids", "queries", "centroids")
        write_csv(out / "centroids.csv", [{"epsilon": k.split("=")[1], "queries": x, "centroids": c}
                                          for k, (xs, cs) in curves.items() for x, c in zip(xs, cs, strict=True)],
                  ["epsilon", "queries", "centroids"])
    return {"cells": len(rows), "victim_accuracy": prep.victim_accuracy, "worst_case": wc,
            "outputs": sorted(p.name for p in out.iterdir() if p.is_file())}
