"""Extraction section: a KnockoffNets attacker against the model unguarded and behind ModelGuard-S / -W.

The attacker queries `budget` natural inputs (the model's own training distribution: the worst case for the owner)
and trains a substitute of the same architecture on the answers; the report gives the substitute's test accuracy
and its fidelity (agreement with the model's clean top-1), and each defense's utility cost: the top-1 accuracy of
the *defended* answers and their mean ℓ1 distortion.

Behind ModelGuard-S the model also answers as ``guard serve`` does by default: with the 0.5 % answer watermark and
the PRADA detector on the attacker's stream. The section then verifies the substitute it stole (the watermark's
p-value, the queries the verification spent) and reports the detector's verdict on that stream: what the owner
could prove, and whether the owner would have been warned.
"""

from __future__ import annotations

from pathlib import Path

import torch

from modelward.assess.config import AssessConfig
from modelward.assess.findings import clopper_pearson
from modelward.assess.profiles import BUDGET_FLOORS, ProfileSizes
from modelward.assess.sections.common import (
    Headline,
    SectionResult,
    Work,
    fit_budget,
    forward_flops,
    interval_verdict,
    pct,
    seconds_per_point_gradient,
    section_progress,
)
from modelward.assess.target import Target
from modelward.core.plots import grouped_bars
from modelward.extraction.attacks import EvalSet, SubstituteConfig, TransferSet, make_extraction_attack
from modelward.extraction.defenses import make_defense
from modelward.extraction.ownership import (
    AnswerWatermark,
    LocalSuspect,
    PradaDetector,
    WatermarkedVictim,
    new_key,
    verify_ownership,
)
from modelward.extraction.victim import LocalVictim

DEFENSES = ("none", "modelguard_s", "modelguard_w")


def plan(cfg: AssessConfig, sz: ProfileSizes) -> list[Work]:
    """The section's planned work for the sizes `sz` (point-gradients)."""
    q = cfg.extraction.budget or sz.query_budget
    return [Work("KnockoffNets", q, sz.substitute_epochs + 1, len(DEFENSES),
                 f"{len(DEFENSES)} defenses × {q} queries × ({sz.substitute_epochs} substitute epochs + the answers)")]


def run(cfg: AssessConfig, target: Target, sizes: ProfileSizes, out: Path, root: Path) -> SectionResult:
    res = SectionResult("extraction", "Model extraction (KnockoffNets) and its defenses")
    data, model = target.data, target.model
    budget = cfg.extraction.budget or sizes.query_budget
    k = data.num_classes
    with torch.no_grad():
        clean_probs = torch.softmax(model(data.x_test), 1)
    victim_acc = float((clean_probs.argmax(1) == data.y_test).float().mean())
    ev = EvalSet(data.x_test, data.y_test, clean_probs.argmax(1))
    transfer = TransferSet(data.x_train, data.y_train)
    progress = section_progress("extraction")
    sizes, works, note = fit_budget("extraction", sizes, cfg.sizes, lambda sz: plan(cfg, sz),
                                    3 * forward_flops(model, data.x_test), BUDGET_FLOORS["extraction"])
    budget = cfg.extraction.budget or sizes.query_budget
    attack = make_extraction_attack("knockoff", "naive", substitute=SubstituteConfig(epochs=sizes.substitute_epochs))
    res.plan = progress.announce(works, seconds_per_point_gradient(model, data.x_test, data.y_test), note)
    if note:
        res.notes.append(note)
    rows = []
    ownership: dict = {}
    for name in DEFENSES:
        params = {} if name == "none" else {"epsilon": cfg.extraction.epsilon}
        defense = make_defense(name, **params)
        if name == "modelguard_s":  # as `guard serve` answers by default: watermark, and the detector watching
            victim = WatermarkedVictim(model, defense, AnswerWatermark(new_key()), PradaDetector(), num_classes=k)
        else:
            victim = LocalVictim(model, defense, num_classes=k)
        outcome = attack.run(victim, transfer, budget, target.factory, seed=cfg.seed, eval_set=ev)
        if isinstance(victim, WatermarkedVictim):
            ownership = _ownership(victim, outcome.substitute, budget)
        attack_l1 = victim.mean_l1
        # the defense's utility cost, measured on the test set with a fresh copy of its state
        probe = LocalVictim(model, make_defense(name, **params), num_classes=k)
        answers = probe.query(data.x_test)
        progress.step(budget * (sizes.substitute_epochs + 1), f"{name}: {budget} queries, substitute accuracy "
                      f"{pct(outcome.accuracy)}")
        rows.append({"defense": name, "epsilon": params.get("epsilon", 0.0), "budget": budget,
                     "substitute_accuracy": outcome.accuracy, "fidelity": outcome.fidelity,
                     "defended_top1_accuracy": float((answers.argmax(1) == data.y_test).float().mean()),
                     "mean_l1_distortion": float((answers - clean_probs).abs().sum(1).mean()),
                     "attack_mean_l1": attack_l1})
    res.add_table(out, "extraction", "KnockoffNets substitute vs defense", rows,
                  notes=[f"victim clean test accuracy {victim_acc:.4f}; substitute = the model's architecture, "
                         f"{sizes.substitute_epochs} epochs; queries drawn from the training distribution"])
    groups = [r["defense"] for r in rows]
    p = grouped_bars(out / "extraction.png", groups, {
        "substitute accuracy": ([r["substitute_accuracy"] for r in rows], [0.0] * len(rows)),
        "fidelity": ([r["fidelity"] for r in rows], [0.0] * len(rows)),
        "defended answers' accuracy (utility)": ([r["defended_top1_accuracy"] for r in rows], [0.0] * len(rows)),
    }, f"KnockoffNets, {budget} queries", "fraction", (0.0, 1.05))
    res.add_figure(p, root, "Extraction vs defense", "What an attacker's substitute achieves, and what each defense "
                   "costs honest users (accuracy of the answers they receive).")
    unguarded = rows[0]["substitute_accuracy"] / max(victim_acc, 1e-9)
    best = min(rows[1:], key=lambda r: r["substitute_accuracy"])
    res.headline = Headline(f"substitute accuracy / victim accuracy, unguarded, {budget} queries", unguarded,
                            pct(unguarded))

    n_test = len(data.y_test)
    k_sub = round(rows[0]["substitute_accuracy"] * n_test)
    # the ratio has two measured terms: both intervals at 97.5 % (Bonferroni), the ratio's range from their ends
    lo, hi = clopper_pearson(k_sub, n_test, 0.975)
    v_lo, v_hi = clopper_pearson(round(victim_acc * n_test), n_test, 0.975)
    measured = [f"{'ModelGuard-S' if r['defense'] == 'modelguard_s' else 'ModelGuard-W'} at ε = {r['epsilon']:g} "
                f"(measured here, {budget} queries): substitute accuracy {pct(rows[0]['substitute_accuracy'])} → "
                f"{pct(r['substitute_accuracy'])}; utility cost: honest users' top-1 accuracy {pct(victim_acc)} → "
                f"{pct(r['defended_top1_accuracy'])}, mean ℓ1 distortion of the answers "
                f"{r['mean_l1_distortion']:.3f} (serve it with `modelward guard serve "
                f"examples/guard_{r['defense']}.toml`)" for r in sorted(rows[1:], key=lambda r: r["substitute_accuracy"])]
    res.add_metric("substitute_ratio.unguarded", f"extraction: KnockoffNets substitute accuracy ÷ model accuracy, "
                   f"unguarded, {budget} queries", unguarded, n=n_test, risk_up=True, headline=True,
                   context={"thresholds": [0.7, 0.9], "ci": [lo / max(v_hi, 1e-9), min(hi / max(v_lo, 1e-9), 2.0)],
                            "ci_method": "substitute and model accuracy, Clopper–Pearson at 97.5 % each (Bonferroni)",
                            "rule": "green ≤ 70 %, amber ≤ 90 %, red above", "actions": measured})
    for r in rows[1:]:
        k = round(r["substitute_accuracy"] * n_test)
        res.add_metric(f"substitute_accuracy.{r['defense']}", f"extraction behind {r['defense']} "
                       f"(ε = {r['epsilon']:g}): substitute accuracy", r["substitute_accuracy"], k=k, n=n_test,
                       risk_up=True, context={"severity": "info", "rule": "for information: what a defense leaves "
                                              "an attacker", "actions": measured})
    if ownership:
        res.add_table(out, "ownership", "Could the owner prove it, and was the owner warned? (behind ModelGuard-S, "
                      "with guard serve's default watermark and detector)", [ownership],
                      notes=["watermark p-value: the chance that a model that never saw these answers matches the "
                             "keyed classes this often (exact binomial null, 1/(K−1) per marked row); the detector "
                             "is PRADA (δ = 0.93) on the attacker's query stream"])
        res.add_metric("ownership.watermark_p", f"extraction: watermark p-value of the stolen substitute "
                       f"({ownership['marked_rows']} marked rows of {budget} answers)", ownership["watermark_p"],
                       risk_up=True, unit="score",
                       context={"severity": "info", "mapping": "extraction",
                                "rule": "for information: p < 1e-6 identifies the copy (docs/guard.md, Ownership)",
                                "actions": ["Keep [ownership.watermark] on in `guard serve` (the default) and the "
                                            "key in state_dir; test a suspect with `modelward guard verify "
                                            "GUARD.toml --suspect MODEL_OR_URL`"]})
    head = next(m for m in res.metrics if m["key"] == "substitute_ratio.unguarded")
    res.verdict, _, note = interval_verdict([head])
    res.rule = ("green when the whole 95 % interval of the ratio is ≤ 70 %, red when it is wholly > 90 %, amber "
                "otherwise (how much of the model's accuracy a thief recovers)") + (f"; {note}" if note else "")
    res.summary = (f"With {budget} queries a KnockoffNets substitute reaches {pct(rows[0]['substitute_accuracy'])} "
                   f"test accuracy ({pct(unguarded)} of the model's {pct(victim_acc)}); behind {best['defense']} "
                   f"(ε = {best['epsilon']}) it reaches {pct(best['substitute_accuracy'])}, at a utility cost of "
                   f"{pct(victim_acc - best['defended_top1_accuracy'])} accuracy and mean ℓ1 distortion "
                   f"{best['mean_l1_distortion']:.3f}.")
    return res


def _ownership(victim, substitute, budget: int) -> dict:  # noqa: ANN001 - a WatermarkedVictim, an nn.Module
    """The watermark verification of the stolen substitute and the detector's verdict on the attacker's stream."""
    records = victim.records()
    report = verify_ownership(LocalSuspect(substitute), watermark=records)
    ev = report.evidence[0]
    verdict = victim.verdict()
    return {"queries": budget, "marked_rows": len(records), "watermark_matches": ev.matches,
            "watermark_p": ev.p_value, "verification_queries": ev.queries, "identified_at_1e-6": ev.p_value < 1e-6,
            "detector_flagged": bool(verdict and verdict.flagged_at is not None),  # ever: a flag can clear
            "detector_flagged_at": None if verdict is None else verdict.flagged_at,
            "detector_shapiro_w": None if verdict is None else verdict.shapiro_w}

