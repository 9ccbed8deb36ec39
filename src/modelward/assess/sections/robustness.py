"""Robustness section: clean accuracy, robust accuracy vs ε (FGSM, PGD under L∞ and ℓ2, C&W), certified accuracy.

C&W minimises the perturbation instead of taking an ε, so its curve is read from the minimal ℓ2 distortions it
found: at ε a point counts as robust if it was misclassified by nobody at distance ≤ ε (correct, and C&W needed more
than ε or failed). That keeps every curve of the ℓ2 plot on one axis. For a GloRo net the certified accuracy
(VRA) is computed from its sound Lipschitz bound; for any other ``nn.Sequential`` ending in a linear layer the same
bound is computed and the report shows what it *would* certify, the honest lower end of the story.
"""

from __future__ import annotations

from pathlib import Path

import torch

from modelward.assess.config import AssessConfig
from modelward.assess.profiles import ProfileSizes
from modelward.assess.sections.common import Headline, SectionResult, pct, traffic_light
from modelward.assess.target import Target


def _points(target: Target, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return target.data.x_test[:n], target.data.y_test[:n]


def _clip(x: torch.Tensor) -> tuple[float, float]:
    return (float(x.min()), float(x.max()))


def _sweep(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, name: str, norm: str, eps: list[float],
           steps: int, clip: tuple[float, float], seed: int) -> list[float]:
    from modelward.robustness.metrics import robust_accuracy

    params = {"norm": norm, "clip": clip, "seed": seed} if name == "pgd" else {"norm": norm, "clip": clip}
    if name == "pgd":
        params["steps"] = steps
    pts = robust_accuracy(model, x, y, name, eps, params)
    return [p.robust_accuracy for p in pts]


def _cw_curve(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, eps: list[float], steps: int,
              clip: tuple[float, float], seed: int) -> tuple[list[float], float]:
    from modelward.robustness.attacks import attack_mode, make_attack, predict

    with attack_mode(model):
        correct = predict(model, x) == y
    # lr 0.05: with the default 0.01, C&W stalls within a quick profile's steps and its curve would flatter the model
    res = make_attack("cw", model, steps=steps, lr=0.05, binary_steps=4, clip=clip, seed=seed)(x, y)
    dist = (res.x_adv - x).flatten(1).norm(dim=1)
    found = res.success & correct
    curve = [float((correct & ~(found & (dist <= e + 1e-6))).float().mean()) for e in eps]
    median = float(dist[found].median()) if found.any() else float("nan")
    return curve, median


def _certified(target: Target, x: torch.Tensor, y: torch.Tensor, eps: list[float]) -> tuple[list[float], str]:
    from modelward.robustness.gloro.certify import certify
    from modelward.robustness.gloro.net import GloroNet

    if target.gloro is not None:
        net = target.gloro
        label = "certified (GloRo)"
    else:
        net = GloroNet(target.model, target.data.input_shape, epsilon=eps[0])
        label = "would certify (Lipschitz bound)"
    return [certify(net, x, y, epsilon=e).vra for e in eps], label


def run(cfg: AssessConfig, target: Target, sizes: ProfileSizes, out: Path, root: Path) -> SectionResult:
    from modelward.core.plots import line_plot

    res = SectionResult("robustness", "Robustness to evasion attacks")
    model = target.model
    x, y = _points(target, sizes.n_eval)
    clip = _clip(target.data.x_train)
    span = clip[1] - clip[0]
    linf = list(cfg.robustness.linf_eps or [e * span for e in sizes.linf_eps])
    l2 = list(cfg.robustness.l2_eps or [e * span for e in sizes.l2_eps])
    ref = sizes.reference_l2 * span if cfg.robustness.l2_eps is None else l2[len(l2) // 2]
    if ref not in l2:
        l2 = sorted([*l2, ref])
    from modelward.robustness.attacks import attack_mode, predict

    with attack_mode(model):
        clean = float((predict(model, x) == y).float().mean())

    curves_linf = {f"{a.upper()} L∞": _sweep(model, x, y, a, "linf", linf, sizes.pgd_steps, clip, cfg.seed)
                   for a in ("fgsm", "pgd")}
    curves_l2 = {f"{a.upper()} ℓ2": _sweep(model, x, y, a, "l2", l2, sizes.pgd_steps, clip, cfg.seed)
                 for a in ("fgsm", "pgd")}
    xc, yc = x[: sizes.cw_points], y[: sizes.cw_points]
    cw, cw_median = _cw_curve(model, xc, yc, l2, sizes.cw_steps, clip, cfg.seed)
    curves_l2[f"C&W ℓ2 (first {len(yc)} points)"] = cw
    cert_label = ""
    try:
        cert, cert_label = _certified(target, x, y, l2)
        curves_l2[cert_label] = cert
    except Exception as e:  # noqa: BLE001 - an architecture the bound does not cover is reported, not fatal
        cert = []
        res.notes.append(f"no Lipschitz certificate: {e}")

    rows = [{"norm": "L∞", "epsilon": round(e, 6), **{k: v[i] for k, v in curves_linf.items()}}
            for i, e in enumerate(linf)]
    res.add_table(out, "robust_accuracy_linf", "Robust accuracy under L∞ attacks", rows)
    rows2 = [{"norm": "ℓ2", "epsilon": round(e, 6), **{k: v[i] for k, v in curves_l2.items()}}
             for i, e in enumerate(l2)]
    res.add_table(out, "robust_accuracy_l2", "Robust accuracy under ℓ2 attacks (and certified accuracy)", rows2,
                  notes=[f"C&W ignores ε: its column counts a point robust when the smallest misclassifying "
                         f"perturbation C&W found is larger than ε (median found: {cw_median:.3f})."])
    for name, eps, curves in (("linf", linf, curves_linf), ("l2", l2, curves_l2)):
        series = {k: ([0.0, *eps], [clean, *v]) for k, v in curves.items()}
        p = line_plot(out / f"robustness_{name}.png", series, f"Robust accuracy vs ε ({'L∞' if name == 'linf' else 'ℓ2'})",
                      "ε", "accuracy")
        res.add_figure(p, root, f"Robustness curve ({'L∞' if name == 'linf' else 'ℓ2'})",
                       "Accuracy on the first test points after each attack, by perturbation size ε.")
    i_ref = l2.index(ref)
    if target.gloro is not None and cert:
        value, label = cert[i_ref], f"certified accuracy at ℓ2 ε = {ref:.3g}"
    else:
        value, label = curves_l2["PGD ℓ2"][i_ref], f"PGD-ℓ2 robust accuracy at ε = {ref:.3g}"
    res.headline = Headline(label, value, pct(value))
    res.verdict = traffic_light(value, 0.7, 0.4)
    res.rule = "green ≥ 70 %, amber ≥ 40 %, red below (of all evaluated test points)"
    res.summary = (f"Clean accuracy {pct(clean)} on {len(y)} test points; {label}: {pct(value)}"
                   + (f"; the Lipschitz bound {cert_label.split('(')[0].strip()} {pct(cert[i_ref])} at that ε"
                      if cert and target.gloro is None else "") + ".")
    res.notes.append("Empirical attacks give an upper bound on true robust accuracy; certified accuracy a lower bound.")
    return res
