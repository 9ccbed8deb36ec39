"""MC-hardness tables and plots, rebuilt from a study folder's run files (seed 000 §3.2 Eq. 1, App. C layout).

Per (part, procedure, α): the ratio C'(ℓ*_α)/C(ℓ*_α) of each run, capped (the paper's convention) and uncapped
(``modelward.completion.metric``); for multi-task problems the per-task ratios are averaged within each seed;
statistics over seeds (median, mean, sample SD, min, max, n) plus the number of capped and of not-reached runs.
The from-scratch reference T0 has its own row (part ``(all)``). The infimum over procedures (Eq. 1) is taken per
threat-model group — procedures that keep the replay buffer, procedures that reset it, or all procedures when
none says — over the group's procedures and T0 (always available, §3.2); it names the procedure that attains it
and its margin over the runner-up relative to the SD over seeds of their paired differences (retraining seed i
of every procedure uses the same randomness, ``procedures.paired_seeds``).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelward.completion.config import read_study_config
from modelward.completion.metric import MIN_EVALS, Thresholds, hardness_ratio
from modelward.completion.plan import is_usable, make_problem, orig_id, study_parts
from modelward.completion.problem import CompletionProblem, OriginalRun
from modelward.completion.procedures import ALL_PARTS
from modelward.core.ledger import RunLedger
from modelward.core.parts import resolve_part
from modelward.core.plots import plt
from modelward.core.records import write_csv, write_table
from modelward.core.stats import summarize
from modelward.errors import ModelwardError

STATS = ["median", "mean", "sd", "min", "max"]
FIELDS = ["part", "procedure", "group", "alpha", *STATS, "n", "capped", "not_reached",
          *[f"{k}_uncapped" for k in STATS]]
INF_FIELDS = ["part", "alpha", "group", "value", "procedure", "runner_up", "runner_up_value", "margin",
              "margin_sd", "margin_in_sd", "n_paired"]
GROUP_LABEL = {"kept": "buffer kept", "reset": "buffer reset", "all": "all procedures"}


def _group(proc: Any) -> str:
    return {True: "kept", False: "reset"}.get(proc.keep_buffer, "all")


@dataclass
class HardnessTables:
    rows: list[dict[str, Any]]
    inf_rows: list[dict[str, Any]]
    originals: list[dict[str, Any]]
    filtered: list[str] = field(default_factory=list)
    missing: int = 0
    task_rows: list[dict[str, Any]] = field(default_factory=list)  # per task (multi-task problems), over seeds
    warnings: list[str] = field(default_factory=list)
    tasks: list[dict[str, Any]] = field(default_factory=list)  # the study's game list (RL: kept / filtered)


def _eval_every(cfg: Any) -> int | None:
    if cfg.kind == "rl":
        return (cfg.rl or {}).get("eval_every")
    return cfg.train.eval_every


def _select(problem: CompletionProblem, cfg: Any, results: dict[str, dict[str, Any]], out: Path | None
            ) -> tuple[dict[tuple[str, int], Thresholds], dict[tuple[str, int], bool], list[dict[str, Any]],
                       list[dict[str, Any]]]:
    """Thresholds and the usable decision of every finished original; the originals table; the task list."""
    thr: dict[tuple[str, int], Thresholds] = {}
    usable: dict[tuple[str, int], bool] = {}
    runs: dict[str, list[OriginalRun]] = defaultdict(list)
    for task in problem.tasks:
        for seed in cfg.seeds:
            res = results.get(orig_id(task, seed))
            if res is None:
                continue
            curve = [tuple(p) for p in res["curve"]]
            thr[(task, seed)] = Thresholds.from_curve(curve, cfg.alphas, cfg.thresholds.smoothing)
            runs[task].append(OriginalRun(seed, task, curve, Path(out or ".") / res["checkpoint"],
                                          res.get("extras", {})))
    tasks = []
    select = getattr(problem, "select_tasks", None)
    for task, rs in runs.items():
        for r in rs:
            usable[(task, r.seed)] = is_usable(problem, r, thr[(task, r.seed)], rs)
        if callable(select):
            tasks.append({"task": task, **select(rs)[task]})
    rnd = getattr(problem, "random_loss", None)
    originals = []
    for task, rs in runs.items():
        for r in rs:
            t = thr[(task, r.seed)]
            test = r.extras.get("test_curve")
            originals.append({"task": task, "seed": r.seed, "loss0": t.loss0, "best": t.best,
                              "steps": r.curve[-1][0], "random": float(rnd(task)) if callable(rnd) else None,
                              **{f"C(alpha={a})": t.costs[a] for a in cfg.alphas},
                              **{f"evals(alpha={a})": (t.evals or {}).get(a) for a in cfg.alphas},
                              "test_final": float(test[-1][1]) if test else None,
                              "test_best": min(float(v) for _, v in test) if test else None,
                              "usable": usable[(task, r.seed)]})
    return thr, usable, originals, tasks


def _quantisation_warnings(cfg: Any, originals: list[dict[str, Any]]) -> list[str]:
    out = []
    every = _eval_every(cfg)
    for a in sorted(cfg.alphas, reverse=True):
        few = [o for o in originals if o["usable"] and o[f"evals(alpha={a})"] is not None
               and 0 < o[f"evals(alpha={a})"] < MIN_EVALS]
        if not few:
            continue
        c_min = min(o[f"C(alpha={a})"] for o in few)
        seeds = ", ".join(f"{o['task'] + ' ' if o['task'] else ''}seed {o['seed']} ({o[f'evals(alpha={a})']})"
                          for o in few)
        tip = f"; evaluate more often, e.g. eval_every ≤ {max(1, c_min // MIN_EVALS)}" if every else ""
        out.append(f"α = {a:g}: the original reached ℓ*_α after fewer than {MIN_EVALS} evaluations in {seeds}, "
                   f"so a ratio can take only a few values (it is quantised in steps of 1/evaluations){tip}.")
    return out


def compute_tables(cfg: Any, problem: CompletionProblem, results: dict[str, dict[str, Any]],
                   out: Path | None = None) -> HardnessTables:
    alphas = sorted(cfg.alphas, reverse=True)
    parts = study_parts(cfg, problem)
    procs = cfg.all_procedures
    thr, usable, originals, tasks = _select(problem, cfg, results, out)
    filtered = [f"{o['task'] or 'model'} seed {o['seed']}" for o in originals if not o["usable"]]
    per_seed: dict[tuple[str, str, float, int], list[tuple[float, float]]] = defaultdict(list)
    per_task: dict[tuple[str, str, str, float], list[float]] = defaultdict(list)
    counts: dict[tuple[str, str, float], list[int]] = defaultdict(lambda: [0, 0])  # capped, not reached
    for res in results.values():
        if res.get("kind") != "re" or "curve" not in res:
            continue
        key = (res["task"], res["seed"])
        if key not in thr or not usable[key]:
            continue
        curve = [tuple(p) for p in res["curve"]]
        for a in alphas:
            r = hardness_ratio(curve, thr[key].values[a], thr[key].costs[a], res.get("budget"))
            per_seed[(res["part"], res["procedure"], a, res["seed"])].append((r.value, r.raw))
            per_task[(res["task"], res["part"], res["procedure"], a)].append(r.value)
            c = counts[(res["part"], res["procedure"], a)]
            c[0] += int(r.capped)
            c[1] += int(not r.reached)
    rows: list[dict[str, Any]] = []
    seed_means: dict[tuple[str, str, float], dict[int, float]] = {}
    missing = 0
    for part in ([ALL_PARTS] if any(p.kind == "T0" for p in procs) else []) + parts:
        for proc in procs:
            if (proc.kind == "T0") != (part == ALL_PARTS):
                continue
            for a in alphas:
                capped, raw, by_seed = [], [], {}
                for seed in cfg.procedure_seeds(proc):
                    vals = per_seed.get((part, proc.name, a, seed))
                    if vals:
                        by_seed[seed] = statistics.fmean(v for v, _ in vals)
                        capped.append(by_seed[seed])
                        raw.append(statistics.fmean(w for _, w in vals))
                    else:
                        missing += 1
                seed_means[(part, proc.name, a)] = by_seed
                c = counts.get((part, proc.name, a), [0, 0])
                rows.append({"part": part, "procedure": proc.name, "group": _group(proc), "alpha": a,
                             **summarize(capped).as_dict(), "capped": c[0], "not_reached": c[1],
                             **{f"{k}_uncapped": v for k, v in summarize(raw).as_dict().items() if k != "n"}})
    by_key = {(r["part"], r["procedure"], r["alpha"]): r for r in rows}
    t0 = next((p for p in procs if p.kind == "T0"), None)
    groups = list(dict.fromkeys(_group(p) for p in procs if p.kind != "T0"))
    inf_rows = []
    for part in parts:
        for a in alphas:
            for g in groups:
                cands = [(p.name, part) for p in procs if p.kind != "T0" and _group(p) == g]
                if t0 is not None:
                    cands.append((t0.name, ALL_PARTS))
                scored = sorted((by_key[(pt, name, a)]["mean"], name, pt) for name, pt in cands
                                if by_key[(pt, name, a)]["n"])
                if not scored:
                    continue
                row: dict[str, Any] = {"part": part, "alpha": a, "group": g, "value": scored[0][0],
                                       "procedure": scored[0][1], "runner_up": None, "runner_up_value": None,
                                       "margin": None, "margin_sd": None, "margin_in_sd": None, "n_paired": 0}
                if len(scored) > 1:
                    best = seed_means[(scored[0][2], scored[0][1], a)]
                    nxt = seed_means[(scored[1][2], scored[1][1], a)]
                    diffs = [nxt[s] - best[s] for s in best if s in nxt]
                    sd = statistics.stdev(diffs) if len(diffs) > 1 else math.nan
                    margin = scored[1][0] - scored[0][0]
                    ratio = (margin / sd if sd > 0 else (math.inf if margin > 0 else math.nan)) \
                        if not math.isnan(sd) else math.nan
                    row.update(runner_up=scored[1][1], runner_up_value=scored[1][0], margin=margin, margin_sd=sd,
                               margin_in_sd=ratio, n_paired=len(diffs))
                inf_rows.append(row)
    task_rows = []
    if len(problem.tasks) > 1:
        for task in problem.tasks:
            for part in [ALL_PARTS, *parts]:
                for proc in procs:
                    for a in alphas:
                        vals = per_task.get((task, part, proc.name, a), [])
                        if vals:
                            task_rows.append({"task": task, "part": part, "procedure": proc.name, "alpha": a,
                                              **summarize(vals).as_dict()})
    return HardnessTables(rows, inf_rows, originals, filtered, missing, task_rows,
                          _quantisation_warnings(cfg, originals), tasks)


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


def _fmt(x: float | None, digits: int = 2) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def cell(r: dict[str, Any]) -> str:
    """``median / mean ± SD [min–max]`` (capped), then the uncapped mean ± SD and the capped / not-reached runs."""
    if not r["n"]:
        return "–"
    out = f"{_fmt(r['median'])} / {_fmt(r['mean'])} ± {_fmt(r['sd'])} [{_fmt(r['min'])}–{_fmt(r['max'])}]"
    out += f"; uncapped {_fmt(r['mean_uncapped'])} ± {_fmt(r['sd_uncapped'])}"
    flags = [f"{r['capped']} capped"] if r["capped"] else []
    flags += [f"{r['not_reached']} not reached"] if r["not_reached"] else []
    return out + (f" ({', '.join(flags)})" if flags else "")


def inf_text(r: dict[str, Any] | None) -> str:
    if r is None:
        return "–"
    out = f"{r['value']:.2f} {r['procedure']}"
    if r["runner_up"] is not None:
        sd = r["margin_in_sd"]
        rel = "" if sd is None or math.isnan(sd) else (" (∞ SD)" if math.isinf(sd) else f", {sd:.1f} SD")
        out += f" (−{r['margin']:.2f} vs {r['runner_up']}{rel})"
    return out


def _columns(cfg: Any) -> tuple[list[str], list[str]]:
    procs = [p.name for p in cfg.all_procedures if p.kind != "T0"]
    groups = list(dict.fromkeys(_group(p) for p in cfg.all_procedures if p.kind != "T0"))
    return procs, groups


def reference_text(t: HardnessTables, a: float) -> str:
    """The T0 reference at α: "T0 (from scratch, every parameter): <cell>", or "" without one."""
    r = next((r for r in t.rows if r["part"] == ALL_PARTS and r["alpha"] == a), None)
    return "" if r is None else f"{r['procedure']} (from scratch, every parameter re-initialised): {cell(r)}"


def _table_rows(cfg: Any, t: HardnessTables, a: float) -> list[list[str]]:
    procs, groups = _columns(cfg)
    lines = []
    for part in dict.fromkeys(r["part"] for r in t.rows if r["part"] != ALL_PARTS):
        cells = [cell(next(r for r in t.rows if r["part"] == part and r["procedure"] == p and r["alpha"] == a))
                 for p in procs]
        infs = [inf_text(next((x for x in t.inf_rows if x["part"] == part and x["alpha"] == a and x["group"] == g),
                              None)) for g in groups]
        lines.append([part, *cells, *infs])
    return lines


def rich_tables(cfg: Any, t: HardnessTables) -> list[Any]:
    """One rich Table per α (highest first) for terminal output: part × procedure cells plus the infima."""
    from rich.markup import escape
    from rich.table import Table

    procs, groups = _columns(cfg)
    out = []
    for a in sorted(cfg.alphas, reverse=True):
        table = Table(title=f"{cfg.name}: MC-hardness at α={a:g} — median / mean ± SD \\[min–max] over seeds "
                            "(capped at 1); uncapped mean ± SD")
        table.add_column("part")
        for p in procs:
            table.add_column(p)
        for g in groups:
            table.add_column(f"inf (Eq. 1), {GROUP_LABEL[g]}")
        for row in _table_rows(cfg, t, a):
            table.add_row(*[escape(c) for c in row])
        ref = reference_text(t, a)
        if ref:
            table.caption = escape("reference " + ref)
        out.append(table)
    return out


def conventions(cfg: Any) -> list[str]:
    """The report's conventions in plain words (they are also in ``metric.py``)."""
    if cfg.kind == "rl":
        where = ("the loss is minus the mean return over the fixed evaluation episodes (`[rl] eval_*`)")
    elif cfg.thresholds.split == "validation":
        where = (f"the loss is measured on a validation split ({cfg.thresholds.val_fraction:.0%} of the training "
                 "data, held out from training); the test split only reports (originals table)")
    else:
        where = "the loss is measured on the test split (the paper's choice)"
    smooth = (f" ℓ* is the best mean of {cfg.thresholds.smoothing} consecutive evaluations, not a single one."
              if cfg.thresholds.smoothing > 1 else "")
    return [
        "How to read this report:",
        "",
        "- A run's **ratio** is the number of steps the retraining needed to first reach the threshold ℓ*_α, divided "
        "by the number of steps the original training needed to reach it. ℓ*_α = α·ℓ* + (1−α)·L(θ₀), where ℓ* is "
        f"the best loss of the original run and L(θ₀) the loss before training; {where}.{smooth}",
        "- **Capped** (the paper's convention, the first numbers of a cell): a retraining that was slower than the "
        "original counts as 1.0, and one that never reached the threshold within its budget also counts as 1.0 — "
        "because training from scratch is always possible. The cell says how many runs were capped and how many "
        "never reached the threshold.",
        "- **Uncapped**: the ratio as measured, which can exceed 1; a run that never reached the threshold counts "
        "as budget ÷ original steps, which understates it.",
        "- **T0** retrains the whole model from scratch with the original schedule and the same budget. It is the "
        "measured meaning of \"as hard as training from scratch\": its uncapped value should be near 1, and its "
        "capped value shows how much the cap alone pulls a procedure that gets no help below 1.",
        "- **inf (Eq. 1)** is the lowest mean over the procedures of one threat model (replay buffer kept vs reset "
        "are separate columns: keeping it assumes an attacker who holds the agent's experience) and T0. It names "
        "the procedure, the margin over the runner-up, and that margin in SDs over seeds of the paired "
        "differences (retraining seed i uses the same randomness in every procedure). A margin under ~1 SD means "
        "the minimum may just pick noise.",
        "- Statistics are over seeds: median / mean ± SD (n−1) [min–max]; multi-game studies average each seed's "
        "games first.",
    ]


def markdown(cfg: Any, t: HardnessTables) -> str:
    procs, groups = _columns(cfg)
    lines = [f"# MC-hardness: {cfg.name}", "", *conventions(cfg), ""]
    if t.missing:
        lines += [f"**Partial study:** {t.missing} (part, procedure, α, seed) results are not finished yet; the n "
                  "column of hardness.csv says how many seeds each cell has. Re-run `modelward complete run` to "
                  "finish.", ""]
    if t.warnings:
        lines += ["**Quantised ratios:**", ""] + [f"- {w}" for w in t.warnings] + [""]
    for a in sorted(cfg.alphas, reverse=True):
        head = ["Part", *procs, *[f"inf (Eq. 1), {GROUP_LABEL[g]}" for g in groups]]
        ref = reference_text(t, a)
        lines += [f"## α = {a:g}", ""] + ([f"**Reference** {ref}", ""] if ref else [])
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(row) + " |" for row in _table_rows(cfg, t, a)]
        lines.append("")
    has_random = any(o["random"] is not None for o in t.originals)
    has_test = any(o["test_final"] is not None for o in t.originals)
    reference = "random policy" if has_random else "untrained model"
    al = sorted(cfg.alphas, reverse=True)
    head = ["task", "seed", "L(θ₀)", "ℓ*", *(["L(random)"] if has_random else []), "steps",
            *[f"C(ℓ*_{a:g}) [evals]" for a in al], *(["test L final", "test L best"] if has_test else [])]
    lines += ["## Original training runs", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for o in t.originals:
        mark = "" if o["usable"] else f" (filtered: no better than the {reference})"
        row = [f"{o['task'] or '-'}{mark}", str(o["seed"]), f"{o['loss0'] + 0.0:.4f}", f"{o['best'] + 0.0:.4f}"]
        if has_random:
            row.append(f"{o['random'] + 0.0:.4f}")  # + 0.0 turns -0.0 into 0.0
        row.append(str(o["steps"]))
        row += [f"{o[f'C(alpha={a})']} [{o[f'evals(alpha={a})']}]" for a in al]
        if has_test:
            row += [_fmt(o["test_final"], 4), _fmt(o["test_best"], 4)]
        lines.append("| " + " | ".join(row) + " |")
    if t.tasks:
        kept = [x["task"] for x in t.tasks if x["keep"]]
        dropped = [f"{x['task']} (mean gain over random {x['gain']:.2f})" for x in t.tasks if not x["keep"]]
        lines += ["", "Game list of this study (decided once on all original runs of each game): "
                  + (", ".join(kept) or "none") + "." + (f" Filtered: {', '.join(dropped)}." if dropped else "")]
    if t.filtered:
        lines += ["", f"Filtered runs (no better than the {reference}; excluded from the statistics): "
                  + ", ".join(t.filtered)]
    return "\n".join(lines) + "\n"


def hardness_plot(path: Path, cfg: Any, t: HardnessTables, proc: str) -> Path:
    """Bars per part (T0 first, as the reference) and α: capped mean with SD error bars clipped to the axis;
    a black diamond marks the uncapped mean, a number above a bar how many of its runs were capped or not
    reached."""
    import numpy as np

    t0 = [r["procedure"] for r in t.rows if r["part"] == ALL_PARTS]
    parts = [ALL_PARTS] * bool(t0) + list(dict.fromkeys(r["part"] for r in t.rows if r["part"] != ALL_PARTS))
    labels = [f"{t0[0]} (all)" if p == ALL_PARTS else p for p in parts]
    alphas = sorted(cfg.alphas)
    top = max([1.1] + [min(3.0, r["mean_uncapped"] * 1.05) for r in t.rows
                       if r["n"] and not math.isnan(r["mean_uncapped"])])
    width = 0.8 / len(alphas)
    x = np.arange(len(parts))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(parts) * max(1, len(alphas) / 2)), 4.0))
    for i, a in enumerate(alphas):
        rs = [next((r for r in t.rows if r["part"] == p and r["alpha"] == a
                    and r["procedure"] == (t0[0] if p == ALL_PARTS else proc)), None) for p in parts]
        mean = np.array([r["mean"] if r and r["n"] else 0.0 for r in rs])
        sd = np.array([0.0 if not r or not r["n"] or math.isnan(r["sd"]) else r["sd"] for r in rs])
        err = np.vstack([np.minimum(sd, mean), np.minimum(sd, np.maximum(top - mean, 0.0))])  # clipped to axis
        xs = x + (i - (len(alphas) - 1) / 2) * width
        ax.bar(xs, mean, width, yerr=err, capsize=2, label=f"α={a:g}")
        for xi, r in zip(xs, rs, strict=True):
            if not r or not r["n"]:
                continue
            raw = r["mean_uncapped"]
            if not math.isnan(raw):
                ax.plot([xi], [min(raw, top * 0.98)], marker="D" if raw <= top else "^", color="black",
                        markersize=3.5, linestyle="none")
            k = r["capped"] + r["not_reached"]
            if k:  # inside the bar's foot, where error bars and diamonds never are
                ax.text(xi, 0.02 * top, str(k), ha="center", va="bottom", fontsize=7, color="white",
                        fontweight="bold")
    ax.plot([], [], marker="D", color="black", linestyle="none", markersize=3.5, label="uncapped mean")
    ax.set_xticks(x, labels, rotation=30 if len(parts) > 6 else 0, ha="right" if len(parts) > 6 else "center")
    ax.set_ylim(0.0, top)
    ax.set_ylabel("C'(ℓ*_α) / C(ℓ*_α)  (capped mean ± SD)")
    ax.set_title(f"{cfg.name}: MC-hardness, {proc} (white numbers: runs capped or not reached)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


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
    write_csv(out / "hardness_inf.csv", t.inf_rows, INF_FIELDS)
    if t.task_rows:
        write_csv(out / "hardness_by_task.csv", t.task_rows, ["task", "part", "procedure", "alpha", *STATS, "n"])
    rows = problem.parts_table()
    wanted = set(study_parts(cfg, problem)) | {"total"}
    write_csv(out / "parts.csv", [r for r in rows if r["part"] in wanted] + _extra_parts(cfg, problem, rows),
              ["part", "params", "params_excl_norm"])
    for proc in _columns(cfg)[0]:
        hardness_plot(out / f"hardness_{proc}.png", cfg, t, proc)
    return t


def _extra_parts(cfg: Any, problem: CompletionProblem, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Parts named in the study that are not natural parts (globs, unions): count them on the model."""
    known = {r["part"] for r in rows}
    extra = [p for p in study_parts(cfg, problem) if p not in known]
    if not extra or not hasattr(problem, "build"):
        return []

    model = problem.build()
    out = []
    for p in extra:
        part = resolve_part(model, p)
        out.append({"part": p, "params": part.num_parameters(model),
                    "params_excl_norm": part.num_parameters_excluding_norm(model)})
    return out
