"""MC-hardness tables and plots, rebuilt from a study folder's run files (seed 000 §3.2 Eq. 1, App. C layout).

Per (part, procedure, α): the ratio C'(ℓ*_α)/C(ℓ*_α) of each run; for multi-task problems the per-task ratios are
averaged within each seed; statistics over seeds (median, mean, sample SD, min, max, n, not_reached). The infimum
over procedures (Eq. 1) is the minimum over procedures of the mean.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelward.completion.config import read_study_config
from modelward.completion.metric import Thresholds, hardness_ratio
from modelward.completion.plan import is_usable, make_problem, orig_id, study_parts
from modelward.completion.problem import CompletionProblem, OriginalRun
from modelward.core.ledger import RunLedger
from modelward.core.plots import grouped_bars
from modelward.core.records import write_csv, write_table
from modelward.core.stats import summarize
from modelward.errors import ModelwardError

FIELDS = ["part", "procedure", "alpha", "median", "mean", "sd", "min", "max", "n", "not_reached"]


@dataclass
class HardnessTables:
    rows: list[dict[str, Any]]
    inf_rows: list[dict[str, Any]]
    originals: list[dict[str, Any]]
    filtered: list[str] = field(default_factory=list)
    missing: int = 0
    task_rows: list[dict[str, Any]] = field(default_factory=list)  # per task (multi-task problems), over seeds


def compute_tables(cfg: Any, problem: CompletionProblem, results: dict[str, dict[str, Any]],
                   out: Path | None = None) -> HardnessTables:
    alphas = sorted(cfg.alphas, reverse=True)
    parts = study_parts(cfg, problem)
    procs = [p.name for p in cfg.procedures]
    thr: dict[tuple[str, int], Thresholds] = {}
    usable: dict[tuple[str, int], bool] = {}
    originals = []
    filtered = []
    for task in problem.tasks:
        for seed in cfg.seeds:
            res = results.get(orig_id(task, seed))
            if res is None:
                continue
            curve = [tuple(p) for p in res["curve"]]
            t = Thresholds.from_curve(curve, cfg.alphas)
            run = OriginalRun(seed, task, curve, Path(out or ".") / res["checkpoint"], res.get("extras", {}))
            thr[(task, seed)] = t
            usable[(task, seed)] = is_usable(problem, run, t)
            if not usable[(task, seed)]:
                filtered.append(f"{task or 'model'} seed {seed}")
            rnd = getattr(problem, "random_loss", None)
            originals.append({"task": task, "seed": seed, "loss0": t.loss0, "best": t.best, "steps": curve[-1][0],
                              "random": float(rnd(task)) if callable(rnd) else None,
                              **{f"C(alpha={a})": t.costs[a] for a in alphas},
                              "usable": usable[(task, seed)]})
    per_seed: dict[tuple[str, str, float, int], list[float]] = defaultdict(list)
    per_task: dict[tuple[str, str, str, float], list[float]] = defaultdict(list)
    not_reached: dict[tuple[str, str, float], int] = defaultdict(int)
    missing = 0
    for res in results.values():
        if res.get("kind") != "re":
            continue
        key = (res["task"], res["seed"])
        if key not in thr or not usable[key]:
            continue
        curve = [tuple(p) for p in res["curve"]]
        for a in alphas:
            r = hardness_ratio(curve, thr[key].values[a], thr[key].costs[a])
            per_seed[(res["part"], res["procedure"], a, res["seed"])].append(r.value)
            per_task[(res["task"], res["part"], res["procedure"], a)].append(r.value)
            if not r.reached:
                not_reached[(res["part"], res["procedure"], a)] += 1
    rows, inf_rows = [], []
    for part in parts:
        for a in alphas:
            best: tuple[float, str] | None = None
            for proc in procs:
                vals = []
                for seed in cfg.seeds:
                    task_vals = per_seed.get((part, proc, a, seed))
                    if task_vals:
                        vals.append(statistics.fmean(task_vals))
                    else:
                        missing += 1
                s = summarize(vals).as_dict()
                rows.append({"part": part, "procedure": proc, "alpha": a, **s,
                             "not_reached": not_reached.get((part, proc, a), 0)})
                if s["n"] and (best is None or s["mean"] < best[0]):
                    best = (float(s["mean"]), proc)
            if best is not None:
                inf_rows.append({"part": part, "alpha": a, "value": best[0], "procedure": best[1]})
    task_rows = []
    if len(problem.tasks) > 1:
        for task in problem.tasks:
            for part in parts:
                for proc in procs:
                    for a in alphas:
                        vals = per_task.get((task, part, proc, a), [])
                        if vals:
                            task_rows.append({"task": task, "part": part, "procedure": proc, "alpha": a,
                                              **summarize(vals).as_dict()})
    return HardnessTables(rows, inf_rows, originals, filtered, missing, task_rows)


def live_estimate(cfg: Any, problem: CompletionProblem, results: dict[str, dict[str, Any]]) -> str:
    """A one-line running estimate for the progress bar: the Eq. (1) infimum at the highest α per part."""
    try:
        t = compute_tables(cfg, problem, results)
    except Exception:  # never let the estimate break a running study
        return ""
    a = max(cfg.alphas)
    vals = [(r["value"], r["part"]) for r in t.inf_rows if r["alpha"] == a]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    return f"MC(α={a:g}) so far: {lo[0]:.2f} ({lo[1]}) … {hi[0]:.2f} ({hi[1]})"


def _fmt(x: float, digits: int = 2) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def cell(r: dict[str, Any]) -> str:
    if not r["n"]:
        return "–"
    return f"{_fmt(r['median'])} / {_fmt(r['mean'])} ± {_fmt(r['sd'])} [{_fmt(r['min'])}–{_fmt(r['max'])}]"


def rich_tables(cfg: Any, t: HardnessTables) -> list[Any]:
    """One rich Table per α (highest first) for terminal output: part × procedure cells plus the infimum."""
    from rich.markup import escape
    from rich.table import Table

    procs = [p.name for p in cfg.procedures]
    out = []
    for a in sorted(cfg.alphas, reverse=True):
        table = Table(title=f"{cfg.name}: MC-hardness at α={a:g} — median / mean ± SD \\[min–max] over seeds")
        table.add_column("part")
        for p in procs:
            table.add_column(p)
        table.add_column("inf (Eq. 1)")
        for part in dict.fromkeys(r["part"] for r in t.rows):
            cells = [cell(next(r for r in t.rows if r["part"] == part and r["procedure"] == p and r["alpha"] == a))
                     for p in procs]
            inf = next((r for r in t.inf_rows if r["part"] == part and r["alpha"] == a), None)
            table.add_row(part, *[escape(c) for c in cells], f"{inf['value']:.2f} ({inf['procedure']})" if inf else "–")
        out.append(table)
    return out


def markdown(cfg: Any, t: HardnessTables) -> str:
    procs = [p.name for p in cfg.procedures]
    lines = [f"# MC-hardness: {cfg.name}", "",
             "Each cell: median / mean ± SD (n−1) [min–max] over seeds of C'(ℓ*_α)/C(ℓ*_α). "
             "Runs that never reached a threshold count as 1.0 (see `not_reached` in hardness.csv).", ""]
    if t.missing:
        lines += [f"**Partial study:** {t.missing} (part, procedure, α, seed) results are not finished yet; the n "
                  "column says how many seeds each cell has. Re-run `modelward complete run` to finish.", ""]
    for a in sorted(cfg.alphas, reverse=True):
        lines += [f"## α = {a:g}", "", "| Part | " + " | ".join(procs) + " | inf (Eq. 1) |",
                  "|---|" + "---|" * (len(procs) + 1)]
        parts = list(dict.fromkeys(r["part"] for r in t.rows))
        for part in parts:
            cells = []
            for proc in procs:
                r = next(x for x in t.rows if x["part"] == part and x["procedure"] == proc and x["alpha"] == a)
                c = cell(r)
                if r["not_reached"]:
                    c += f" ({r['not_reached']} not reached)"
                cells.append(c)
            inf = next((x for x in t.inf_rows if x["part"] == part and x["alpha"] == a), None)
            inf_s = f"{inf['value']:.2f} ({inf['procedure']})" if inf else "–"
            lines.append(f"| {part} | " + " | ".join(cells) + f" | {inf_s} |")
        lines.append("")
    has_random = any(o["random"] is not None for o in t.originals)
    reference = "random policy" if has_random else "untrained model"
    lines += ["## Original training runs", "",
              "| task | seed | L(θ₀) | ℓ* | " + ("L(random) | " if has_random else "") + "steps | "
              + " | ".join(f"C(ℓ*_{a:g})" for a in sorted(cfg.alphas, reverse=True)) + " |",
              "|---|---|---|---|---|" + ("---|" if has_random else "") + "---|" * len(cfg.alphas)]
    for o in t.originals:
        costs = " | ".join(str(o[f"C(alpha={a})"]) for a in sorted(cfg.alphas, reverse=True))
        mark = "" if o["usable"] else f" (filtered: no better than the {reference})"
        rnd = f"{o['random'] + 0.0:.4f} | " if has_random else ""  # + 0.0 turns -0.0 into 0.0
        lines.append(f"| {o['task'] or '-'}{mark} | {o['seed']} | {o['loss0'] + 0.0:.4f} | {o['best'] + 0.0:.4f} | {rnd}"
                     f"{o['steps']} | {costs} |")
    if t.filtered:
        lines += ["", f"Filtered (no better than the {reference}; excluded from the statistics): "
                  + ", ".join(t.filtered)]
    return "\n".join(lines) + "\n"


def write_report(out: str | Path, problem: CompletionProblem | None = None) -> HardnessTables:
    """(Re)build hardness.{csv,md,json}, hardness_inf.csv, hardness_<procedure>.png and parts.csv in `out`.

    `problem` is the study's learning problem when it is not the one its config describes (a study run with your
    own model); by default it is rebuilt from ``study.json``.
    """
    out = Path(out).resolve()
    cfg_file = out / "study.json"
    if not cfg_file.is_file() or not (out / "ledger.sqlite").is_file():
        raise ModelwardError(f"{out}: not a study folder (needs study.json and ledger.sqlite from 'complete run')")
    cfg = read_study_config(out)
    problem = problem or make_problem(cfg)
    results = RunLedger(out / "ledger.sqlite").results()
    t = compute_tables(cfg, problem, results, out)
    write_table(out, "hardness", t.rows, FIELDS, markdown=markdown(cfg, t))
    write_csv(out / "hardness_inf.csv", t.inf_rows, ["part", "alpha", "value", "procedure"])
    if t.task_rows:
        write_csv(out / "hardness_by_task.csv", t.task_rows, ["task", *FIELDS[:-1]])
    rows = problem.parts_table()
    wanted = set(study_parts(cfg, problem)) | {"total"}
    write_csv(out / "parts.csv", [r for r in rows if r["part"] in wanted] + _extra_parts(cfg, problem, rows),
              ["part", "params", "params_excl_norm"])
    parts = list(dict.fromkeys(r["part"] for r in t.rows))
    for proc in [p.name for p in cfg.procedures]:
        series = {}
        for a in sorted(cfg.alphas):
            rs = [next(x for x in t.rows if x["part"] == p and x["procedure"] == proc and x["alpha"] == a)
                  for p in parts]
            series[f"α={a:g}"] = ([0.0 if not r["n"] else r["mean"] for r in rs],
                                  [0.0 if not r["n"] or math.isnan(r["sd"]) else r["sd"] for r in rs])
        grouped_bars(out / f"hardness_{proc}.png", parts, series, f"{cfg.name}: MC-hardness, {proc}",
                     "C'(ℓ*_α) / C(ℓ*_α)  (mean ± SD over seeds)", (0.0, 1.1))
    return t


def _extra_parts(cfg: Any, problem: CompletionProblem, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Parts named in the study that are not natural parts (globs, unions): count them on the model."""
    known = {r["part"] for r in rows}
    extra = [p for p in study_parts(cfg, problem) if p not in known]
    if not extra or not hasattr(problem, "build"):
        return []
    from modelward.core.parts import resolve_part

    model = problem.build()
    out = []
    for p in extra:
        part = resolve_part(model, p)
        out.append({"part": p, "params": part.num_parameters(model),
                    "params_excl_norm": part.num_parameters_excluding_norm(model)})
    return out
