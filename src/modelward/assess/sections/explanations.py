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
from modelward.assess.findings import rate_metric
from modelward.assess.profiles import ProfileSizes
from modelward.assess.sections.common import SEVERITY_VERDICT, Headline, SectionResult, traffic_light
from modelward.assess.target import Target
from modelward.bias.amplification import bias_amplification
from modelward.core.plots import grouped_bars
from modelward.explain.interpret import attribute, top_units
from modelward.explain.layers import feature_layer
from modelward.explain.plots import attribution_grid


def run(cfg: AssessConfig, target: Target, sizes: ProfileSizes, out: Path, root: Path) -> SectionResult:
    res = SectionResult("explanations", "Explanations and bias amplification")
    d, model = target.data, target.model
    x, y = d.x_test[: sizes.explain_points], d.y_test[: sizes.explain_points]
    layer = feature_layer(model, x[:2])  # what the classifier reads, by data flow (a ResNet: its pooled features)
    unit_rows = []
    for c in range(d.num_classes):
        xc = x[y == c]
        if len(xc) == 0:
            continue
        for rank, u in enumerate(top_units(model, layer, xc, target=c, k=3), start=1):
            unit_rows.append({"class": d.class_names[c], "rank": rank, "layer": layer, "unit": u.unit,
                              "influence": u.score})
    res.add_table(out, "top_units", f"Most influential units of '{layer}' per class", unit_rows,
                  notes=["internal influence (point DoI over the test points of the class, the class logit as QoI)"])
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
        res.verdict = SEVERITY_VERDICT[rate_metric(res.metrics[-1])]
        res.rule = rule
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
