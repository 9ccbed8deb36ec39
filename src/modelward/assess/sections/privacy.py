"""Privacy section: membership inference (loss threshold, LiRA offline, the thesis' white-box attack on the last
layer) as ROC curves with TPR at low FPR, and a model-inversion grid (seed 002 Ch. 8, Eq. 8.1).

Members are training points of the model; non-members are test points it never saw. The attacker's hold-out data
(for thresholds and shadow models) is the other half of the test split, disjoint from the points it is scored on.
Shadow models use the model's architecture and the assessment's training recipe (``[train]``).

The verdict (issue 38) rests on three figures per attack, each with an interval that carries all of its sampling
noise: the TPR at 1 % FPR (its threshold is set by the non-members, so its interval bounds both rates:
:func:`modelward.privacy.metrics.tpr_at_fpr_interval`), the ROC AUC (DeLong) and the advantage TPR − FPR at the
attack's own, pre-set threshold (Newcombe). A figure whose interval reaches its chance level (1 %, ½, 0) is no
evidence of leakage and rates low; the others are rated by their thresholds, and the section's verdict is the worst
rating. So one low-FPR point on few samples cannot turn a chance-level model amber, and an overfit model whose loss
attack has a clear AUC and advantage is not green because its TPR at 1 % FPR happened to be 0.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from modelward.assess.config import AssessConfig
from modelward.assess.findings import SEVERITY_ORDER, fmt_value, rate_metric
from modelward.assess.profiles import BUDGET_FLOORS, ProfileSizes
from modelward.assess.sections.common import (
    SEVERITY_VERDICT,
    Headline,
    NotAssessed,
    SectionResult,
    Work,
    fit_budget,
    forward_flops,
    seconds_per_point_gradient,
    section_progress,
)
from modelward.assess.target import Target
from modelward.privacy.figures import image_grid, roc_plot
from modelward.privacy.inversion import invert
from modelward.privacy.membership.base import AttackData
from modelward.privacy.membership.deep_wb import DeepWB
from modelward.privacy.membership.lira import LiRA
from modelward.privacy.membership.loss import LossAttack
from modelward.privacy.membership.naive import NaiveAttack
from modelward.privacy.metrics import MembershipFigures, evaluate, membership_figures, roc_curve, save_scores
from modelward.privacy.shadows import ModelTrainer, ShadowPool


def _last_layer_input(model: torch.nn.Module) -> str:
    linear = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    if not linear:
        raise NotAssessed("the white-box attack needs a final nn.Linear layer")
    return linear[-1]


def plan(cfg: AssessConfig, target: Target, sizes: ProfileSizes) -> list[Work]:
    """The section's planned work for `sizes` (point-gradients)."""
    d = target.data
    n = min(sizes.mia_points, len(d.x_test) - len(d.x_test) // 2, len(d.x_train))
    steps = cfg.train.steps if sizes.shadow_steps is None else sizes.shadow_steps
    batch = cfg.train.batch_size
    works = [Work("shadow models (LiRA)", batch, steps, sizes.shadows,
                  f"{sizes.shadows} models × {steps} steps × {batch} points"),
             Work("scoring", max(1, (2 * n) // 3), sizes.shadows + 3,  # a forward pass: a third of a gradient
                  detail=f"{2 * n} points × ({sizes.shadows} shadows + the model) forward, white-box influences")]
    if d.is_image:
        works.append(Work("model inversion", d.num_classes, sizes.inversion_steps,
                          detail=f"{d.num_classes} classes × {sizes.inversion_steps} steps"))
    return works


def fit_sizes(cfg: AssessConfig, target: Target, sizes: ProfileSizes) -> tuple[ProfileSizes, list[Work], str]:
    """The quick profile's budget: fewer scored points and shadow models, and no LiRA at all when even two shadow
    models of this model exceed it (the loss and white-box attacks need none)."""
    fpu = 3 * forward_flops(target.model, target.data.x_test)
    sizes, works, note = fit_budget("privacy", sizes, cfg.sizes, lambda sz: plan(cfg, target, sz), fpu,
                                    BUDGET_FLOORS["privacy"])
    budget = sizes.budget_tflop
    if budget is not None and "shadows" not in cfg.sizes and sum(w.units for w in works) * fpu > budget * 1e12:
        need = works[0].units * fpu / 1e12
        sizes = replace(sizes, shadows=0)
        works = plan(cfg, target, sizes)
        note = (f"{note}; " if note else "quick profile: ") + (
            f"LiRA not run: its shadow models alone would need {need:.2g} TFLOP, over the budget of {budget:g} "
            "(--profile standard trains 16; the loss and white-box attacks need none)")
    return sizes, works, note


def run(cfg: AssessConfig, target: Target, sizes: ProfileSizes, out: Path, root: Path) -> SectionResult:
    res = SectionResult("privacy", "Privacy: membership inference and model inversion")
    if target.membership is None:
        raise NotAssessed("which points the model was trained on is not known: give the held-out data as "
                          "[data] test_path (npz, csv, idx) or the training rows as [data] train_index (a .npy "
                          "index/mask or a text file of row indices), or assess a `modelward train` checkpoint "
                          "whose metadata records its split; scoring a guessed split would mix members into the "
                          "non-members")
    d = target.data
    res.notes.append(f"membership: {target.membership}")
    sizes, works, budget_note = fit_sizes(cfg, target, sizes)
    g = torch.Generator().manual_seed(cfg.seed)
    test_perm = torch.randperm(len(d.x_test), generator=g)
    half = len(test_perm) // 2
    aux_idx, non_idx = test_perm[:half], test_perm[half:]
    n = min(sizes.mia_points, len(non_idx), len(d.x_train))
    if n < 20:
        raise NotAssessed(f"too few held-out test points to score membership ({n}; need at least 20)")
    non_idx = non_idx[:n]
    mem_idx = torch.randperm(len(d.x_train), generator=g)[:n]
    x_eval = torch.cat([d.x_train[mem_idx], d.x_test[non_idx]])
    y_eval = torch.cat([d.y_train[mem_idx], d.y_test[non_idx]])
    members = np.r_[np.ones(n, bool), np.zeros(n, bool)]
    # which rows were scored (training and test rows of the data), so any tool can re-score the same points
    np.savez(out / "points.npz", members=mem_idx.numpy(), non_members=non_idx.numpy())
    train_cfg = cfg.train if sizes.shadow_steps is None else cfg.train.model_copy(update={"steps": sizes.shadow_steps})
    trainer = ModelTrainer(target.factory, train_cfg)
    x_aux, y_aux = d.x_test[aux_idx], d.y_test[aux_idx]
    progress = section_progress("privacy")
    # timed on the shadows' own batch size: on a small model the per-batch overhead dominates
    res.plan = progress.announce(works, seconds_per_point_gradient(target.model, x_aux, y_aux, train_cfg.batch_size),
                                 budget_note)
    if budget_note:
        res.notes.append(budget_note)
    data = AttackData(target.model, x_aux, y_aux, d.num_classes, trainer=trainer, seed=cfg.seed)
    data.shadows = ShadowPool.train(trainer, x_aux, y_aux, sizes.shadows, seed=cfg.seed) if sizes.shadows else None
    progress.step(works[0].units, f"{sizes.shadows} shadow models trained ({train_cfg.steps} steps each)")
    # the naive attack (member iff classified correctly; Yeom et al.) has the generalisation gap as its advantage
    attacks = {"naive (correct = member)": NaiveAttack(), "loss threshold": LossAttack(),
               "LiRA offline": LiRA(online=False),
               "white-box (last layer)": DeepWB(slices=[(_last_layer_input(target.model), "input")], proxies=2,
                                                shadows=2, exact=True)}
    rows, curves, figures = [], {}, {}
    for label, attack in attacks.items():
        try:
            attack.fit(data)
            scores = attack.score(x_eval, y_eval)
            progress.step(works[1].units // 3, f"{label}: {2 * n} points scored")
        except Exception as e:  # noqa: BLE001 - one attack that cannot run on this model is reported, not fatal
            res.notes.append(f"{label}: not run ({type(e).__name__}: {e})")
            continue
        m = evaluate(scores, members, attack.threshold)
        f = membership_figures(scores, members, attack.threshold)
        figures[label] = f
        save_scores(out, label.split()[0].lower().replace("-", "_"), scores, members)
        fpr, tpr, _ = roc_curve(scores, members)
        curves[label] = (fpr, tpr)
        rows.append({"attack": label, "auc": f.auc, "auc_95ci": _ci_text(f.auc_ci, "auc"),
                     "tpr_at_1%_fpr": f.tpr_at_1pct_fpr, "tpr_at_1%_fpr_95ci": _ci_text(f.tpr_at_1pct_fpr_ci),
                     "tpr_at_0.1%_fpr": f.tpr_at_0_1pct_fpr, "advantage": f.advantage,
                     "advantage_95ci": _ci_text(f.advantage_ci), "precision": m.precision,
                     "members": m.n_members, "non_members": m.n_nonmembers})
    if not rows:
        raise NotAssessed("no membership attack could run on this model (see the notes)")
    res.add_table(out, "membership", "Membership inference", rows,
                  notes=[f"{n} training points vs {n} unseen test points; {sizes.shadows} shadow models; "
                         "scores and membership saved as .npy next to this table",
                         "95 % intervals: TPR at 1 % FPR bounds both the members' rate and the true FPR of the "
                         "threshold the non-members set (exact order-statistic and Clopper–Pearson bounds); AUC by "
                         "DeLong; advantage (TPR − FPR at the attack's own threshold) by Newcombe"])
    p = roc_plot(out / "roc.png", curves, "Membership inference ROC (log scale)")
    res.add_figure(p, root, "Membership inference ROC", "True-positive rate against false-positive rate, both on "
                   "log scales (the field's convention: what matters is the TPR at low FPR).")
    if d.is_image:
        targets = list(range(d.num_classes))
        inv = invert(target.model, targets, x0=0.0, input_shape=d.input_shape, steps=sizes.inversion_steps,
                     step_size=0.05, box=(float(d.x_train.min()), float(d.x_train.max())))
        p = image_grid(out / "inversion.png", inv.x, [f"{d.class_names[j]} ({c:.2f})" for j, c in
                                                      zip(targets, inv.confidence.tolist(), strict=True)],
                       ncol=min(10, len(targets)), title="Model inversion (Eq. 8.1), one image per class")
        res.add_figure(p, root, "Model inversion", "Inputs reconstructed from the model alone by gradient descent, "
                       "with the model's confidence in the class; recognisable digits mean the model encodes them.")
        conf = float(inv.confidence.mean())
        res.add_metric("inversion_confidence", "model inversion: mean confidence of the reconstructed class images",
                       conf, risk_up=True, unit="score",
                       context={"mapping": "inversion", "severity": "info",
                                "rule": "for information: judge the grid by eye (a confident, recognisable "
                                        "image per class means the model encodes its classes' appearance)",
                                "actions": ["Serve labels or top-k scores rather than full probabilities; "
                                            "train with DP-SGD (examples/privacy_bcw_dp.toml)."]})
    else:
        res.notes.append("model inversion grid omitted: the inputs are not images")
    rate_membership(res, figures)
    return res


RULE = ("each attack's TPR at 1 % FPR (green ≤ 2 %, amber ≤ 5 %), AUC (green ≤ 0.60, amber ≤ 0.70) and advantage "
        "TPR − FPR at its own threshold (green ≤ 10 points, amber ≤ 25 points), red above; a figure whose 95 % "
        "interval reaches its chance level (1 %, 0.5, 0) is not distinguishable from an attack that learned nothing "
        "and rates green; the worst rating decides")
_FIGURES = (  # key, label, unit, thresholds (green, amber), chance, ci method
    ("tpr_at_1pct_fpr", "TPR at 1 % FPR", "fraction", (0.02, 0.05), 0.01,
     "exact: order-statistic bound on the threshold's true FPR (non-members) + Clopper–Pearson (members)"),
    ("auc", "AUC", "auc", (0.60, 0.70), 0.5, "DeLong"),
    ("advantage", "advantage (TPR − FPR at its threshold)", "fraction", (0.10, 0.25), 0.0,
     "Newcombe hybrid score (difference of two proportions)"),
)


def _ci_text(ci: tuple[float, float], unit: str = "fraction") -> str:
    return f"{fmt_value(ci[0], unit)} – {fmt_value(ci[1], unit)}"


def rate_membership(res: SectionResult, figures: dict[str, MembershipFigures]) -> None:
    """Record every attack's figures as rated metrics (interval, chance level), then the verdict (the worst rating),
    the headline (the figure that decided it) and the summary.

    Args:
        res: the privacy section being built.
        figures: attack label → its :class:`~modelward.privacy.metrics.MembershipFigures`.
    """
    for label, f in figures.items():
        key = label.split()[0].lower().replace("-", "_")
        # a yes/no attack (naive: correct = member) has two score levels: no ROC to read a low FPR from, and its
        # AUC is ½ + advantage/2; only its advantage (the generalisation gap) is a figure of its own
        binary = key == "naive"
        for fig, name, unit, thresholds, chance, method in _FIGURES[2:] if binary else _FIGURES:
            ci = list(getattr(f, f"{fig}_ci"))
            res.add_metric(f"{fig}.{key}", f"membership inference ({label}): {name}", getattr(f, fig),
                           n=f.n_members, risk_up=True, unit=unit,
                           context={"thresholds": list(thresholds), "chance": chance, "ci": ci, "ci_method": method,
                                    "rule": RULE, "n_nonmembers": f.n_nonmembers, "figure": name, "attack": label})
        if binary:
            continue
        res.add_metric(f"tpr_at_0_1pct_fpr.{key}", f"membership inference ({label}): TPR at 0.1 % FPR",
                       f.tpr_at_0_1pct_fpr, n=f.n_members, risk_up=True,
                       context={"severity": "info", "ci": list(f.tpr_at_0_1pct_fpr_ci), "ci_method": _FIGURES[0][5],
                                "rule": "for information: with fewer than a few thousand non-members a 0.1 % FPR "
                                        "is not measurable (see its interval)"})
    rated = [m for m in res.metrics if m["context"].get("thresholds")]
    order = {k: i for i, (k, *_) in enumerate(_FIGURES)}
    for m in rated:
        m["context"]["rated"] = rate_metric(m)
    # the headline: the figure with the worst rating; among equals TPR at 1 % FPR first, then the largest value,
    # then the attack with the largest AUC
    head = min(rated, key=lambda m: (SEVERITY_ORDER.index(m["context"]["rated"]), order[m["key"].split(".")[0]],
                                     -m["value"], -figures[m["context"]["attack"]].auc))
    for m in res.metrics:
        m["headline"] = m is head
    sev = head["context"]["rated"]
    res.verdict = SEVERITY_VERDICT[sev]
    res.rule = RULE
    ci = head["ci"]
    res.headline = Headline(f"{head['context']['figure']} ({head['context']['attack']}), 95 % CI "
                            f"{_ci_text(ci, head['unit'])}", head["value"], fmt_value(head["value"], head["unit"]))
    significant = [m for m in rated if m["ci"][0] > m["context"]["chance"]]  # above chance beyond its noise
    best = max(figures.items(), key=lambda kv: kv[1].auc)
    res.summary = (
        f"The strongest attack by AUC ({best[0]}) reaches AUC {best[1].auc:.3f} (95 % CI "
        f"{_ci_text(best[1].auc_ci, 'auc')}; 0.5 = chance), TPR {fmt_value(best[1].tpr_at_1pct_fpr, 'fraction')} at "
        f"1 % FPR and an advantage of {100 * best[1].advantage:.1f} points. "
        + (f"{len(significant)} figure(s) are above chance beyond their noise: "
           + "; ".join(f"{m['context']['figure']} ({m['context']['attack']}) {fmt_value(m['value'], m['unit'])}"
                       for m in significant) + "."
           if significant else "No figure is distinguishable from an attack that learned nothing at this sample "
           f"size ({next(iter(figures.values())).n_members} members, as many non-members)."))
