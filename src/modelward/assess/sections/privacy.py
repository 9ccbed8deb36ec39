"""Privacy section: membership inference (loss threshold, LiRA offline, the thesis' white-box attack on the last
layer) as ROC curves with TPR at low FPR, and a model-inversion grid (seed 002 Ch. 8, Eq. 8.1).

Members are training points of the model; non-members are test points it never saw. The attacker's hold-out data
(for thresholds and shadow models) is the other half of the test split, disjoint from the points it is scored on.
Shadow models use the model's architecture and the assessment's training recipe (``[train]``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from modelward.assess.config import AssessConfig
from modelward.assess.profiles import BUDGET_FLOORS, ProfileSizes
from modelward.assess.sections.common import (
    Headline,
    NotAssessed,
    SectionResult,
    Work,
    fit_budget,
    forward_flops,
    pct,
    seconds_per_point_gradient,
    section_progress,
    traffic_light,
)
from modelward.assess.target import Target
from modelward.privacy.figures import image_grid, roc_plot
from modelward.privacy.inversion import invert
from modelward.privacy.membership.base import AttackData
from modelward.privacy.membership.deep_wb import DeepWB
from modelward.privacy.membership.lira import LiRA
from modelward.privacy.membership.loss import LossAttack
from modelward.privacy.metrics import evaluate, roc_curve, save_scores
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
    attacks = {"loss threshold": LossAttack(), "LiRA offline": LiRA(online=False),
               "white-box (last layer)": DeepWB(slices=[(_last_layer_input(target.model), "input")], proxies=2,
                                                shadows=2, exact=True)}
    rows, curves = [], {}
    for label, attack in attacks.items():
        try:
            attack.fit(data)
            scores = attack.score(x_eval, y_eval)
            progress.step(works[1].units // 3, f"{label}: {2 * n} points scored")
        except Exception as e:  # noqa: BLE001 - one attack that cannot run on this model is reported, not fatal
            res.notes.append(f"{label}: not run ({type(e).__name__}: {e})")
            continue
        m = evaluate(scores, members, attack.threshold)
        save_scores(out, label.split()[0].lower().replace("-", "_"), scores, members)
        fpr, tpr, _ = roc_curve(scores, members)
        curves[label] = (fpr, tpr)
        rows.append({"attack": label, "auc": m.auc, "tpr_at_0.1%_fpr": m.tpr_at_0_1pct_fpr,
                     "tpr_at_1%_fpr": m.tpr_at_1pct_fpr, "advantage": m.advantage, "precision": m.precision,
                     "members": m.n_members, "non_members": m.n_nonmembers})
    if not rows:
        raise NotAssessed("no membership attack could run on this model (see the notes)")
    res.add_table(out, "membership", "Membership inference", rows,
                  notes=[f"{n} training points vs {n} unseen test points; {sizes.shadows} shadow models; "
                         "scores and membership saved as .npy next to this table"])
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
    worst = max(rows, key=lambda r: r["tpr_at_1%_fpr"])
    value = worst["tpr_at_1%_fpr"]
    rule = ("green ≤ 2 %, amber ≤ 5 %, red above (a TPR near the 1 % FPR means the attack does no better "
            "than chance at identifying training points)")
    for r in rows:
        key = r["attack"].split()[0].lower().replace("-", "_")
        res.add_metric(f"tpr_at_1pct_fpr.{key}", f"membership inference ({r['attack']}): TPR at 1 % FPR",
                       r["tpr_at_1%_fpr"], k=round(r["tpr_at_1%_fpr"] * r["members"]), n=r["members"],
                       risk_up=True, headline=r is worst,
                       context={"thresholds": [0.02, 0.05], "rule": rule, "auc": r["auc"]})
    res.headline = Headline(f"TPR at 1 % FPR ({worst['attack']})", value, pct(value))
    res.verdict = traffic_light(value, 0.02, 0.05, higher_is_better=False)
    res.rule = rule
    best_auc = max(r["auc"] for r in rows)
    res.summary = (f"The strongest attack ({worst['attack']}) identifies {pct(value)} of training points at a 1 % "
                   f"false-positive rate; the best AUC is {best_auc:.3f} (0.5 = chance).")
    return res
