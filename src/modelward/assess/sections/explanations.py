"""Explanations and bias section: the most influential internal units per class (internal influence, seed 002
Ch. 3) with input attributions, and bias amplification on the test set (Def. 9.1, one class against the rest).

For a class c, B_c = Pr[F(x) = c] − Pr[y = c] on the test set: a positive value means the model predicts c more
often than it occurs (the thesis' B for the binary task "c vs the rest"). The verdict uses the largest |B_c|.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from modelward.assess.config import AssessConfig
from modelward.assess.profiles import BUDGET_FLOORS, ProfileSizes
from modelward.assess.sections.common import (
    Headline,
    SectionResult,
    Work,
    fit_budget,
    forward_flops,
    interval_verdict,
    seconds_per_point_gradient,
    section_progress,
    traffic_light,
)
from modelward.assess.target import Target
from modelward.bias.amplification import bias_amplification
from modelward.core.data import DataSplit
from modelward.core.plots import grouped_bars
from modelward.explain.interpret import attribute, top_units
from modelward.explain.layers import feature_layer
from modelward.explain.plots import attribution_grid
from modelward.explain.text import token_attributions

TEXT_IG_STEPS = 32


def plan(target: Target, sz: ProfileSizes) -> list[Work]:
    """The section's planned work for the sizes `sz` (point-gradients)."""
    d = target.data
    n = min(len(d.x_test), sz.explain_points)
    n_img = min(10, d.num_classes) if d.is_image else 0
    works = [Work("internal influence", n, 1, detail=f"{n} points × 1 gradient (top units)")]
    if d.is_text:
        works.append(Work("token attributions", n, TEXT_IG_STEPS,
                          detail=f"{n} texts × {TEXT_IG_STEPS} integrated-gradient steps"))
    if n_img:
        works.append(Work("input attributions", n_img, 33, detail=f"{n_img} images × (32 integrated-gradient "
                          "steps + 1 saliency)"))
    return [*works, Work("bias amplification", len(d.x_test) // 3 + 1, 1,
                         detail=f"predictions on {len(d.x_test)} test points")]


def _token_tables(res: SectionResult, out: Path, model: torch.nn.Module, d: DataSplit, x: torch.Tensor,
                  y: torch.Tensor) -> None:
    """Text: integrated gradients at the embedding layer (explain/text.py) for every explained text's true class;
    per class the tokens that raise its score most on average, and one attributed text per class."""
    attr = torch.cat([token_attributions(model, x[i : i + 32], y[i : i + 32], d.special_ids, d.pad_id,
                                         TEXT_IG_STEPS) for i in range(0, len(x), 32)])
    section_progress("explanations").step(len(x) * TEXT_IG_STEPS, f"token attributions: {len(x)} texts")
    rows, examples = [], []
    for c in range(d.num_classes):
        sel = (y == c).nonzero().flatten()
        if len(sel) == 0:
            continue
        ids, a = x[sel].flatten(), attr[sel].flatten()
        real = a != 0
        sums = torch.zeros(int(x.max()) + 1).index_add_(0, ids[real], a[real])
        counts = torch.zeros_like(sums).index_add_(0, ids[real], torch.ones(int(real.sum())))
        mean = torch.where(counts > 0, sums / counts.clamp_min(1), torch.full_like(sums, -torch.inf))
        for rank, t in enumerate(mean.topk(min(5, int((counts > 0).sum()))).indices.tolist(), start=1):
            rows.append({"class": d.class_names[c], "rank": rank, "token": d.token_name(t),
                         "mean_attribution": float(mean[t]), "occurrences": int(counts[t])})
        i = int(sel[0])
        keep = [(d.token_name(int(t)), float(v)) for t, v in zip(x[i], attr[i], strict=True) if int(t) != d.pad_id]
        examples.append({"class": d.class_names[c],
                         "text with attributions": " ".join(f"{w}({v:+.2f})" if v else w for w, v in keep)})
    res.add_table(out, "top_tokens", "Tokens that raise each class's score most (integrated gradients at the "
                  "embedding layer)", rows,
                  notes=[f"mean attribution over the explained test texts of the class where the token occurs; "
                         f"integrated gradients ({TEXT_IG_STEPS} steps) from a baseline with every real token "
                         "replaced by the padding embedding (special tokens kept), as Captum's "
                         "LayerIntegratedGradients on the word embeddings"])
    res.add_table(out, "attributed_texts", "One test text per class, each token with its attribution to the true "
                  "class", examples)


def run(cfg: AssessConfig, target: Target, sizes: ProfileSizes, out: Path, root: Path) -> SectionResult:
    res = SectionResult("explanations", "Explanations and bias amplification")
    d, model = target.data, target.model
    n_img = min(10, d.num_classes) if d.is_image else 0
    sizes, works, note = fit_budget("explanations", sizes, cfg.sizes, lambda sz: plan(target, sz),
                                    3 * forward_flops(model, d.x_test), BUDGET_FLOORS["explanations"])
    x, y = d.x_test[: sizes.explain_points], d.y_test[: sizes.explain_points]
    layer = feature_layer(model, x[:2])  # what the classifier reads, by data flow (a ResNet: its pooled features)
    progress = section_progress("explanations")
    res.plan = progress.announce(works, seconds_per_point_gradient(model, x, y), note)
    if note:
        res.notes.append(note)
    unit_rows = []
    for c in range(d.num_classes):
        xc = x[y == c]
        if len(xc) == 0:
            continue
        for rank, u in enumerate(top_units(model, layer, xc, target=c, k=3), start=1):
            unit_rows.append({"class": d.class_names[c], "rank": rank, "layer": layer, "unit": u.unit,
                              "influence": u.score})
    progress.step(len(x), f"internal influence of {layer}: {len(x)} points")
    res.add_table(out, "top_units", f"Most influential units of '{layer}' per class", unit_rows,
                  notes=["internal influence (point DoI over the test points of the class, the class logit as QoI)"])
    if d.is_text:
        _token_tables(res, out, model, d, x, y)
    if d.is_image:
        pick = [int((y == c).nonzero()[0]) for c in range(d.num_classes) if (y == c).any()][:10]
        xs = x[pick]
        maps = {"integrated gradients": torch.cat([attribute(model, xs[i : i + 1], int(y[pick[i]]),
                                                              "integrated_gradients", steps=32)
                                                    for i in range(len(pick))]),
                "saliency": torch.cat([attribute(model, xs[i : i + 1], int(y[pick[i]]), "saliency")
                                       for i in range(len(pick))])}
        p = attribution_grid(out / "attributions.png", xs, maps, [d.class_names[int(y[i])] for i in pick],
                             "Input attributions of the true class")
        res.add_figure(p, root, "What the model looks at", "One test image per class (top row) and the pixels "
                       "that raise (red) or lower (blue) its class score.")
        progress.step(n_img * 33, f"input attributions: {n_img} images")
    with torch.no_grad():
        pred = torch.cat([model(d.x_test[i : i + 1024]).argmax(1) for i in range(0, len(d.x_test), 1024)]).numpy()
    truth = d.y_test.numpy()
    bias_rows = [{"class": d.class_names[c], "prior": float((truth == c).mean()),
                  "predicted_rate": float((pred == c).mean()),
                  "bias_amplification": bias_amplification((pred == c).astype(int), (truth == c).astype(int))}
                 for c in range(d.num_classes)]
    res.add_table(out, "bias", "Bias amplification per class (B_c = predicted rate − prior, test set)", bias_rows)
    worst = max(bias_rows, key=lambda r: abs(r["bias_amplification"]))
    value = abs(worst["bias_amplification"])

    p = grouped_bars(out / "bias.png", [r["class"] for r in bias_rows],
                     {"B_c": ([r["bias_amplification"] for r in bias_rows], [0.0] * len(bias_rows))},
                     "Bias amplification per class (test set)", "predicted rate − prior")
    res.add_figure(p, root, "Bias amplification", "Above zero: the class is predicted more often than it occurs.")
    res.headline = Headline(f"largest |B_c| (class {worst['class']})", value, f"{100 * value:.1f} pts")
    res.verdict = traffic_light(value, 0.02, 0.05, higher_is_better=False)
    res.rule = "green ≤ 2 points, amber ≤ 5 points, red above (|predicted rate − prior| of the worst class)"
    acc = float((pred == truth).mean())
    res.summary = (f"Test accuracy {100 * acc:.1f} %; class {worst['class']} is predicted "
                   f"{100 * worst['predicted_rate']:.1f} % of the time against a prior of {100 * worst['prior']:.1f} %"
                   f" (B = {100 * worst['bias_amplification']:+.1f} points). The top units of '{layer}' per class are "
                   "listed below.")
    if np.isnan(value):
        res.verdict = "info"
    else:
        c = d.class_names.index(worst["class"])
        lo, hi = paired_difference_interval(pred == c, truth == c)
        ci = [0.0, max(abs(lo), abs(hi))] if lo <= 0 <= hi else sorted([abs(lo), abs(hi)])
        rule = res.rule + "; a B_c whose 95 % interval contains 0 is not distinguishable from no amplification"
        res.add_metric("bias_amplification.max", f"bias amplification: largest |B_c| (class {worst['class']})",
                       value, n=len(truth), risk_up=True, headline=True,
                       context={"thresholds": [0.02, 0.05], "ci": ci, "chance": 0.0, "rule": rule,
                                "ci_method": "Agresti–Min adjusted Wald interval of a paired difference"})
        res.verdict, _, note = interval_verdict(res.metrics[-1:])
        res.rule = rule + (f"; {note}" if note else "")
    return res


def paired_difference_interval(a: np.ndarray, b: np.ndarray, z: float = 1.959963984540054) -> tuple[float, float]:
    """95 % interval of mean(a) − mean(b) for two yes/no properties of the *same* points (B_c = predicted rate −
    prior on one test set): the Agresti–Min (2005) adjusted Wald interval, ½ added to each cell of the 2×2 table.

    Example:
        >>> lo, hi = paired_difference_interval(np.array([1, 1, 0, 0]), np.array([1, 0, 0, 0]))
        >>> lo < 0.25 < hi
        True
    """
    a, b = np.asarray(a, bool), np.asarray(b, bool)
    n10, n01 = float((a & ~b).sum()) + 0.5, float((~a & b).sum()) + 0.5
    n = len(a) + 2.0
    d = (n10 - n01) / n
    se = np.sqrt((n10 + n01) / n - d * d) / np.sqrt(n)
    return float(d - z * se), float(d + z * se)
