"""Backdoors and poisoning section (issue 41): is there a backdoor in the model, are there poisoned rows in its
training data?

- **Model level, without the training data** (OWASP ML10, ATLAS AML.T0018): Neural Cleanse reverse-engineers the
  smallest trigger of every class on held-out clean images and reads the MAD anomaly index of the smallest (a
  backdoor's target needs a much smaller trigger); MM-BD drives every class's logit margin as high as it goes from
  random images and tests the largest against a Gamma fit to the others (data-free). The reversed trigger of the
  suspect class is then stamped on held-out images of the other classes: the share sent to the suspect class is a
  counted rate with a Clopper–Pearson interval.
- **Data level** (OWASP ML02, ATLAS AML.T0020): activation clustering and SPECTRE on the training rows; the
  classes whose activations split off a small cluster and the most suspicious rows are listed (``suspected_rows``).
- When a detector flags the model, unlearning of the reversed trigger is measured (the repair's cost in clean
  accuracy and what it does to the reversed trigger), for the recommended action.

Verdict: red when both model-level detectors flag the model, amber when one does, green when neither (their
literature thresholds: anomaly index > 2, p < 0.05); with ``[backdoor] reference`` (≥ 3 clean reference models'
``detect.json``) the class-wise calibrated verdicts of ``backdoor.detect.model.reference`` decide instead, and the
card's rule says which rule decided. With ``[backdoor] mntd`` (a meta-classifier trained by ``modelward backdoor
detect`` with ``[detect.mntd]``), MNTD's conformal p-value is a further metric; its flag makes the card amber alone and
red with one other flag (it names no class). Read as triage: the detectors can miss a backdoor
(docs/backdoor.md lists the measured detection and false-positive rates per attack).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from modelward.assess.config import AssessConfig
from modelward.assess.profiles import ProfileSizes
from modelward.assess.sections.common import Headline, NotAssessed, SectionResult
from modelward.assess.target import Target
from modelward.backdoor.attacks.base import backdoor_effect
from modelward.backdoor.detect.data.activation_clustering import ActivationClustering
from modelward.backdoor.detect.data.spectre import Spectre
from modelward.backdoor.detect.model.base import ModelVerdict
from modelward.backdoor.detect.model.bn_shift import BatchNormShift
from modelward.backdoor.detect.model.mmbd import MMBD
from modelward.backdoor.detect.model.mntd import MNTD
from modelward.backdoor.detect.model.neural_cleanse import NeuralCleanse
from modelward.backdoor.experiment import (
    box_of,
    calibrate_verdicts,
    check_reference_settings,
    defender_split,
    detector_settings,
    read_references,
)
from modelward.backdoor.features import last_conv
from modelward.backdoor.mitigate.fine_pruning import effect_of
from modelward.backdoor.mitigate.unlearning import unlearn
from modelward.core.data import DataSplit
from modelward.core.plots import grouped_bars
from modelward.core.records import atomic_write_json
from modelward.errors import ConfigError, DataError
from modelward.privacy.figures import image_grid


@dataclass(frozen=True)
class Budget:
    """The section's work per profile (kept here: the profile table belongs to every section)."""

    clean_points: int
    nc_epochs: int
    mmbd_starts: int
    mmbd_steps: int
    scan_rows: int
    unlearn_steps: int


# Neural Cleanse needs about 300 optimisation steps before its masks stop shrinking: with fewer, unconverged masks
# make some clean models' classes look anomalous (measured: a clean digits CNN went from anomaly index 2.46 at 120
# steps to 1.19 at 450); MM-BD likewise (p 0.043 at 10 starts × 100 steps, 0.20 at 30 × 300)
BUDGETS = {"quick": Budget(150, 60, 30, 300, 2000, 100), "standard": Budget(200, 80, 30, 300, 10000, 200),
           "thorough": Budget(300, 120, 30, 500, 50000, 300)}


def run(cfg: AssessConfig, target: Target, sizes: ProfileSizes, out: Path, root: Path) -> SectionResult:
    res = SectionResult("backdoor", "Backdoors and poisoning (model, training data)")
    d, model = target.data, target.model
    if not d.is_image:
        raise NotAssessed("backdoor detection here works on images (N×C×H×W): the triggers it reverse-engineers are "
                          f"image patterns, and the data's inputs have shape {d.input_shape}")
    if d.num_classes < 3:
        raise NotAssessed(f"the model has {d.num_classes} classes; both detectors compare a class with the others "
                          "and need at least 3")
    b = BUDGETS[cfg.profile]
    clip = box_of(d)
    (xd, yd), (xe, ye) = defender_split(d, cfg.seed)
    nc = NeuralCleanse(epochs=b.nc_epochs, seed=cfg.seed, clip=clip)
    mm = MMBD(starts=b.mmbd_starts, steps=b.mmbd_steps, optimizer="adam", lr=0.05, seed=cfg.seed, clip=clip)
    settings = detector_settings(nc, mm, min(b.clean_points, len(xd)))
    refs = _references(cfg, settings)  # a bad reference is refused before any work
    mntd = _mntd(cfg, d)  # likewise a meta-classifier that cannot be read or was made for other inputs
    v_nc = nc.detect(model, xd[: b.clean_points], d.num_classes)
    v_mm = mm.detect(model, d.input_shape, d.num_classes)
    v_bn = (BatchNormShift(seed=cfg.seed).detect(model, xd[: b.clean_points], d.num_classes)
            if BatchNormShift.layers(model) else None)
    names = list(d.class_names)
    cal = _calibrated(cfg, refs, [v_nc, v_mm], settings, out, res, names)
    rows = [{"class": names[k], "trigger_l1": v_nc.per_class[k],
             "trigger_share_of_image": v_nc.per_class[k] / float(np.prod(d.input_shape[1:])),
             "max_margin": v_mm.per_class[k]} for k in range(d.num_classes)]
    res.add_table(out, "classes", "Per class: Neural Cleanse's smallest trigger and MM-BD's maximum margin", rows,
                  notes=[f"Neural Cleanse on {min(b.clean_points, len(xd))} held-out clean images, {b.nc_epochs} "
                         f"epochs; MM-BD from {b.mmbd_starts} random images per class, {b.mmbd_steps} steps"])
    verdicts = [{"detector": "Neural Cleanse", "statistic": f"anomaly index {v_nc.statistic:.2f}",
                 "threshold": "> 2", "flagged": v_nc.backdoored, "suspect_class": names[v_nc.suspect_class]},
                {"detector": "MM-BD", "statistic": f"p = {v_mm.p_value:.3g}", "threshold": "< 0.05",
                 "flagged": v_mm.backdoored, "suspect_class": names[v_mm.suspect_class]}]
    if v_bn is not None:
        verdicts.append({"detector": "BatchNorm shift", "statistic": f"p = {v_bn.p_value:.3g}",
                         "threshold": f"< {10 ** -v_bn.threshold:g}", "flagged": v_bn.backdoored,
                         "suspect_class": names[v_bn.suspect_class]})
    else:
        res.notes.append("The BatchNorm-shift detector did not run: the model has no BatchNorm layer with running "
                         "statistics.")
    res.add_table(out, "verdicts", "Model-level detectors", verdicts)
    p = grouped_bars(out / "per_class.png", names,
                     {"trigger L1 (÷ median)": ([x / max(float(np.median(v_nc.per_class)), 1e-9)
                                                 for x in v_nc.per_class], [0.0] * len(names)),
                      "max margin (÷ median)": ([x / max(float(np.median(v_mm.per_class)), 1e-9)
                                                for x in v_mm.per_class], [0.0] * len(names))},
                     "Per class, relative to the median class", "ratio")
    res.add_figure(p, root, "Per-class statistics", "A backdoor's target class needs an abnormally small trigger "
                   "(low bar, Neural Cleanse) and reaches an abnormally large margin (high bar, MM-BD).")
    k = (cal[0] if cal else v_nc).suspect_class  # the decided suspect: its reversed trigger is tested and unlearnt
    trig = nc.last.trigger(k, clip)
    pick = list(range(min(d.num_classes, 10)))
    p = image_grid(out / "reversed_triggers.png", (nc.last.masks[pick] * nc.last.patterns[pick]),
                   [f"{names[i]} (L1 {v_nc.per_class[i]:.1f})" for i in pick], ncol=len(pick),
                   title="Reversed triggers (mask × pattern) per class")
    res.add_figure(p, root, "Reversed triggers", "The smallest input pattern Neural Cleanse found that sends clean "
                   "images to each class; a compact, strong pattern for one class is what a planted trigger looks "
                   "like.")
    eff = backdoor_effect(model, trig.apply, xe, ye, k)
    ai_rule = "Neural Cleanse anomaly index: green ≤ 2 (the paper's threshold), amber ≤ 3, red above"
    res.add_metric("neural_cleanse_anomaly_index", f"Neural Cleanse: anomaly index of the smallest trigger (class "
                   f"{names[v_nc.suspect_class]})", v_nc.statistic, risk_up=True, unit="score", headline=True,
                   context={"mapping": "model_poisoning", "thresholds": [2.0, 3.0], "rule": ai_rule,
                            "suspect_class": names[v_nc.suspect_class]})
    res.add_metric("mmbd_p_value", f"MM-BD: p-value of the largest maximum margin (class "
                   f"{names[v_mm.suspect_class]})", float(v_mm.p_value or 1.0), risk_up=False, unit="score",
                   context={"mapping": "model_poisoning", "thresholds": [0.05, 0.001],
                            "rule": "MM-BD p-value: green ≥ 0.05 (the paper's threshold), amber ≥ 0.001, red below",
                            "suspect_class": names[v_mm.suspect_class]})
    res.add_metric("reversed_trigger_success", f"held-out inputs of other classes the reversed trigger of class "
                   f"{names[k]} sends to it", eff.attack_success_rate, k=eff.asr_hits, n=eff.asr_n, risk_up=True,
                   context={"mapping": "model_poisoning", "severity": "info",
                            "rule": "for information: a backdoor's reversed trigger succeeds on nearly every input; "
                                    "read with the trigger's size (table 'classes')"})
    if cal:
        _reference_metrics(res, cal, names, cfg.backdoor.reference_alpha)
    dec = cal or [v_nc, v_mm]  # the verdicts that decide: calibrated against clean references when given
    flagged = int(dec[0].backdoored) + int(dec[1].backdoored)
    agree = dec[0].suspect_class == dec[1].suspect_class
    v_mntd = mntd.detect(model) if mntd is not None else None
    if v_mntd is not None:
        _mntd_metric(res, v_mntd, cfg.backdoor.mntd or "")
    if v_bn is not None:
        _bn_metric(res, v_bn, names)
    if flagged:  # the recommended repair, measured on this model
        ft = cfg.train.model_copy(update={"steps": b.unlearn_steps, "lr": 0.01, "eval_every": b.unlearn_steps,
                                          "lr_schedule": []})
        rep = unlearn(model, trig, xd, yd, xe, ye, finetune=ft, seed=cfg.seed, effect=effect_of(trig.apply, xe, ye, k))
        res.add_table(out, "unlearning", "Unlearning the reversed trigger (measured)", [
            {"": "before", **{m: rep.before[m] for m in ("clean_accuracy", "attack_success_rate")}},
            {"": "after", **{m: rep.after[m] for m in ("clean_accuracy", "attack_success_rate")}}],
            notes=[f"{b.unlearn_steps} fine-tuning steps on the {len(xd)} held-out clean images, 20 % of them with "
                   "the reversed trigger and their true label (Neural Cleanse §VI-C); attack success measured with "
                   "the reversed trigger (the real one is unknown)"])
        _repair_rates(res, rep.after, names[k])  # findings3 (issue 38): counted rates, Clopper–Pearson intervals
        action = (f"Unlearning the reversed trigger (`modelward backdoor mitigate`, measured here): reversed-trigger "
                  f"success {rep.before['attack_success_rate']:.1%} → {rep.after['attack_success_rate']:.1%}, clean "
                  f"accuracy {rep.before['clean_accuracy']:.1%} → {rep.after['clean_accuracy']:.1%}.")
        for m in res.metrics:
            if m["key"] == ("neural_cleanse_reference_p_value" if cal else "neural_cleanse_anomaly_index"):
                m["context"]["actions"] = [action, "Retrain from data of trusted origin after removing the rows "
                                           "`modelward backdoor scan` suspects (table 'suspected_rows').",
                                           "Serve with the STRIP monitor ([strip] in the guard config)."]
    _data_level(res, model, d, b, cfg.seed, out, target)
    flags = {"neural_cleanse_anomaly_index": v_nc.backdoored, "mmbd_p_value": v_mm.backdoored}
    if v_mntd is not None:
        flags["mntd_p_value"] = v_mntd.backdoored
    if v_bn is not None:
        flags["bn_shift_p_value"] = v_bn.backdoored
    _rate_without_interval(res, flags, flagged == 2 and agree)  # findings3 (issue 38)
    res.verdict = "red" if flagged == 2 and agree else "amber" if flagged else "green"
    if v_mntd is not None and v_mntd.backdoored:  # MNTD names no class: with one other flag red, alone amber
        res.verdict = "red" if flagged else "amber"
    if v_bn is not None and v_bn.backdoored:  # likewise the BN shift (its class is a weaker guess: docs)
        res.verdict = "red" if flagged or (v_mntd is not None and v_mntd.backdoored) else "amber"
    res.rule = ("red: both model-level detectors flag a backdoor (Neural Cleanse anomaly index > 2 and MM-BD p < "
                "0.05) and name the same class; amber: one does (or they name different classes); green: neither. "
                "Triage, not proof: docs/backdoor.md gives their measured detection and false-positive rates. "
                "No interval: MM-BD's p-value is itself a test, Neural Cleanse's anomaly index is one run with no "
                "measured spread, so the card rates the detectors' flags, not an interval")
    if cal:  # say which rule decided (issue 41): the calibrated one, not the papers' thresholds
        n_ref = cal[0].extra["references"]
        res.rule = (f"decided against {n_ref} clean reference models ([backdoor] reference): each class's Neural "
                    "Cleanse trigger norm and MM-BD margin compared with the same class in the references, flagged "
                    f"at p < {cfg.backdoor.reference_alpha:g} (Šidák over classes, docs/backdoor.md). red: both "
                    "calibrated detectors flag and name the same class; amber: one does (or they name different "
                    "classes); green: neither. The papers' thresholds (anomaly index > 2, p < 0.05) are shown for "
                    "information only. Only as good as the references are like this model (same data, architecture, "
                    "recipe and profile)")
    else:
        res.rule = "decided by the papers' thresholds (no clean references given). " + res.rule
    if v_mntd is not None:
        res.rule += (f"; with MNTD ([backdoor] mntd, flagged at conformal p < {mntd.alpha:g} against its clean "
                     "calibration shadows): MNTD's flag makes the card amber alone and red with one other flag "
                     "(MNTD names no class)")
    if v_bn is not None:
        res.rule += (f"; the BatchNorm shift (the model's BatchNorm running statistics against the held-out clean "
                     f"images, flagged at p < {10 ** -v_bn.threshold:g} against a null simulated from those images, no "
                     "references): its flag makes the card amber alone and red with one other flag")
    res.headline = Headline("Neural Cleanse anomaly index", v_nc.statistic,
                            f"{v_nc.statistic:.2f} (class {names[k]}); MM-BD p = {v_mm.p_value:.2g}")
    if cal:
        res.headline = Headline("Neural Cleanse vs clean references, −log10 p", cal[0].statistic,
                                f"p = {cal[0].p_value:.2g} (class {names[cal[0].suspect_class]}); MM-BD vs references "
                                f"p = {cal[1].p_value:.2g}; {cal[0].extra['references']} references")
    res.summary = (("Calibrated against clean references: " if cal else "At the papers' thresholds: ") +
                   f"{flagged} of 2 model-level detectors flag a backdoor. Neural Cleanse's "
                   f"{'most deviating' if cal else 'smallest'} trigger (class "
                   f"{names[k]}, {v_nc.per_class[k]:.1f} pixels of mask) has anomaly index {v_nc.statistic:.2f} and "
                   f"sends {eff.attack_success_rate:.1%} of other classes' held-out inputs to {names[k]}; MM-BD's "
                   f"largest margin (class {names[v_mm.suspect_class]}) has p = {v_mm.p_value:.3g}." +
                   (f" The BatchNorm shift has p = {v_bn.p_value:.3g}" + (f" (suspect class "
                    f"{names[v_bn.suspect_class]})." if v_bn.backdoored else ".") if v_bn is not None else ""))
    return res


def _bn_metric(res: SectionResult, v: ModelVerdict, names: list[str]) -> None:
    alpha = 10 ** -v.threshold
    worst = max(v.extra["layers"], key=lambda lay: lay["divergence"] / max(lay["null_q95"], 1e-300))
    res.add_metric("bn_shift_p_value", "BatchNorm shift: the model's BatchNorm running statistics against the "
                   "held-out clean images (p-value against a null simulated from them)", float(v.p_value or 1.0),
                   risk_up=False, unit="score",
                   context={"mapping": "data_poisoning", "thresholds": [alpha, alpha / 10],
                            "rule": f"flagged below {alpha:g}; the smallest p the null can give is "
                                    f"{1 / (1 + v.extra['draws']):.2g} per layer (docs/backdoor.md, sixth round)",
                            "suspect_class": names[v.suspect_class], "layer": worst["layer"],
                            "divergence": worst["divergence"], "null_q95": worst["null_q95"],
                            "actions": ["The model was trained on data unlike the held-out clean images: poisoned "
                                        "rows (a clean-label or warping backdoor shows this way) or a different "
                                        "data source. Ask for the training data's origin; retrain from data of "
                                        "trusted origin after `modelward backdoor scan`.",
                                        "Serve with the STRIP monitor ([strip] in the guard config)."]})


def _mntd(cfg: AssessConfig, d: DataSplit) -> MNTD | None:
    """``[backdoor] mntd``: the trained meta-classifier (safetensors + JSON, nothing unpickled), refused with the field
    named when unreadable or made for other inputs or classes."""
    if not cfg.backdoor.mntd:
        return None
    try:
        det = MNTD.load(cfg.backdoor.mntd)
    except (DataError, ConfigError) as e:
        raise ConfigError(f"backdoor.mntd: {e}") from None
    if det.input_shape != tuple(d.input_shape) or det.num_classes != d.num_classes:
        raise ConfigError(f"backdoor.mntd: {cfg.backdoor.mntd} was trained for inputs {det.input_shape} and "
                          f"{det.num_classes} classes; this model's data has {tuple(d.input_shape)} and "
                          f"{d.num_classes} (train one with `modelward backdoor detect` and [detect.mntd] on this data)")
    return det


def _mntd_metric(res: SectionResult, v: ModelVerdict, path: str) -> None:
    res.add_metric("mntd_p_value", "MNTD meta-classifier: conformal p-value against its clean calibration shadows",
                   float(v.p_value or 1.0), risk_up=False, unit="score",
                   context={"mapping": "model_poisoning", "thresholds": [10 ** -v.threshold, 10 ** -v.threshold / 50],
                            "rule": f"flagged below {10 ** -v.threshold:g} (docs/backdoor.md: MNTD's measured "
                                    "detection and false-positive rates per attack)",
                            "score": v.extra["score"], "calibration_shadows": v.extra["calibration_shadows"],
                            "meta_classifier": path})


def _references(cfg: AssessConfig, settings: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``[backdoor] reference`` models' ``detect.json`` (JSON, no pickle), refused with the path named when
    unreadable or made with other detector settings."""
    refs = read_references(cfg.backdoor.reference, key="backdoor.reference")
    check_reference_settings(refs, settings, cfg.backdoor.reference, key="backdoor.reference")
    return refs


def _calibrated(cfg: AssessConfig, refs: list[dict[str, Any]], verdicts: list[ModelVerdict], settings: dict[str, Any],
                out: Path, res: SectionResult, names: list[str]) -> list[ModelVerdict]:
    """Writes ``detect.json`` (this folder can then serve as a clean reference of another assessment) and, with
    references, returns the verdicts calibrated against those clean models (empty without)."""
    atomic_write_json(out / "detect.json", {"verdicts": [v.to_dict() for v in verdicts], "settings": settings})
    if not refs:
        return []
    paths = cfg.backdoor.reference
    cal = calibrate_verdicts(verdicts, refs, cfg.backdoor.reference_alpha)
    res.add_table(out, "reference_verdicts", f"Calibrated against {len(refs)} clean reference models", [
        {"detector": v.detector, "p_value": v.p_value, "flagged": v.backdoored, "suspect_class": names[v.suspect_class],
         "largest_z": max(v.per_class), "sigma": v.extra["sigma"]} for v in cal],
        notes=[f"references: {', '.join(paths)}", "references without recorded detector settings (made by an older "
               "version) could not be checked for the same settings"
               if any("settings" not in r for r in refs) else "the references' detector settings match this run's"])
    return cal


def _reference_metrics(res: SectionResult, cal: list[ModelVerdict], names: list[str], alpha: float) -> None:
    """The calibrated p-values as the rated metrics; the papers' statistics become information."""
    for m in res.metrics:
        if m["key"] in ("neural_cleanse_anomaly_index", "mmbd_p_value"):
            m["headline"] = False
            m["context"]["severity"] = "info"
            m["context"]["rule"] = "for information: with clean references the calibrated p-values decide"
    for v, label in zip(cal, ("Neural Cleanse", "MM-BD"), strict=True):
        res.add_metric(f"{v.detector}_p_value", f"{label} against {v.extra['references']} clean references: p-value "
                       f"of the most deviating class ({names[v.suspect_class]})", float(v.p_value), risk_up=False,
                       unit="score", headline=v.detector == "neural_cleanse_reference",
                       context={"mapping": "model_poisoning", "thresholds": [alpha, alpha / 50],
                                "rule": f"green ≥ {alpha:g} (the calibrated rule), amber ≥ {alpha / 50:g}, red below",
                                "suspect_class": names[v.suspect_class]})


def _data_level(res: SectionResult, model: nn.Module, d: DataSplit, b: Budget, seed: int, out: Path,
                target: Target) -> None:
    x, y = d.x_train[: b.scan_rows], d.y_train[: b.scan_rows]
    feats = last_conv(model, x).numpy()  # the layer that ranks poisoned rows best (docs/backdoor.md)
    ac = ActivationClustering(seed=seed).scan(None, x, y, features=feats)
    sp = Spectre(seed=seed).scan(None, x, y, features=feats)
    names = d.class_names
    split = [c for c in ac.per_class if c.get("poisoned")]
    top = sp.top(20)
    which = ("the rows the model was trained on" if target.membership else
             "the training split as configured; which rows the model was trained on is not known")
    res.add_table(out, "suspected_rows", "The 20 training rows SPECTRE scores most suspicious", [
        {"row": int(i), "label": names[int(y[i])], "spectre_score": float(sp.scores[i]),
         "activation_clustering_suspected": bool(ac.suspected[i])} for i in top],
        notes=[f"{len(x)} training rows scanned ({which}); every row's scores: `modelward backdoor scan`"])
    res.add_metric("activation_clustering_classes", "classes whose activations split off a small cluster "
                   "(activation clustering, smaller cluster < 35 %)", len(split) / max(len(ac.per_class), 1), k=len(split),
                   n=len(ac.per_class),
                   risk_up=True,
                   context={"mapping": "data_poisoning", "severity": "info",
                            "rule": "for information: a split class is where poisoned rows would sit; small natural "
                                    "sub-populations split too (see docs/backdoor.md for the measured rates)",
                            "classes": [names[c["class"]] for c in split]})


def _repair_rates(res: SectionResult, after: dict, suspect: str) -> None:
    """The measured repair's counted rates as metrics with their Clopper–Pearson intervals (issue 38): the reversed
    trigger's success after unlearning (k of the held-out inputs of other classes) and the clean accuracy after it.
    For information: they say what the recommended action does here, not how risky the model is."""
    res.add_metric("reversed_trigger_success_after_unlearning", f"held-out inputs of other classes the reversed "
                   f"trigger of class {suspect} still sends to it after unlearning", after["attack_success_rate"],
                   k=after["asr_hits"], n=after["asr_n"], risk_up=True,
                   context={"mapping": "model_poisoning", "severity": "info",
                            "rule": "for information: the repair's effect, measured with the reversed trigger"})
    res.add_metric("clean_accuracy_after_unlearning", "clean accuracy on held-out images after unlearning",
                   after["clean_accuracy"], k=after["clean_correct"], n=after["clean_n"], risk_up=False,
                   context={"mapping": "model_poisoning", "severity": "info",
                            "rule": "for information: the repair's cost in clean accuracy"})


NO_INTERVAL = ("no interval: one run of the detector, whose spread from run to run is not measured (MM-BD's p-value "
               "is a test against the other classes, not an interval of itself); so a lone flag is rated medium, high "
               "only when both detectors flag the same class (the card's red), low when its detector does not flag")


def _rate_without_interval(res: SectionResult, flags: dict[str, bool], corroborated: bool) -> None:
    """Rate the detectors' statistics conservatively (issue 38): they have no interval, and one detector's flag on
    one run has a measured false-positive rate on clean models of up to 2 in 10 (docs/backdoor.md), so a statistic
    far past its threshold is not "high" on its own; the finding follows the card: low when its detector does not
    flag, medium when it flags alone (or the two name different classes), high when both flag the same class.
    Metrics whose severity is already fixed (e.g. for information) keep it."""
    for m in res.metrics:
        ctx = m["context"]
        if m["key"] in flags and "severity" not in ctx:
            ctx["severity"] = "high" if flags[m["key"]] and corroborated else "medium" if flags[m["key"]] else "low"
            ctx["rule"] = f"{ctx.get('rule', '')}; {NO_INTERVAL}"
            ctx["interval"] = "none"
    res.notes.append("Intervals: the counted rates (the reversed trigger's success, before and after unlearning, the "
                     "clean accuracy after it, the split classes) carry exact Clopper–Pearson 95 % intervals; the "
                     "detectors' statistics have none (" + NO_INTERVAL + ").")
