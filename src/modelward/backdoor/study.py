"""The detection study behind ``bench/backdoor_detection.py``: many seeded clean and backdoored models per data
set, every detector on each, through the ledger (resumable: an interrupted study continues with the models not
yet done).

One run per model, ``<dataset>|<attack or clean>|<seed>``: train (the attack's target class is ``seed mod K``, so
the detectors meet every class as a target), then

- the attack's effect: clean accuracy and ASR on the evaluation half of the test split;
- model-level: Neural Cleanse and MM-BD verdicts with their statistics (also on clean models: false positives);
- data-level (backdoored models): each method's ROC AUC over all training rows and within the target class, and
  the true/false positives of its own removal rule;
- input-level: STRIP fitted on the defender's clean half; its false rejection rate on the clean evaluation half and
  its detection rate on triggered non-target inputs;
- mitigation (the first ``mitigate_seeds`` backdoored models of each attack): unlearning of Neural Cleanse's
  reversed trigger and fine-pruning, with clean accuracy and ASR after.

:func:`summary_tables` turns the ledger's results into the tables BENCHMARKS.md and docs/backdoor.md show: per data
set and attack the detection rates, per data set the false-positive rates on clean models, and the ROC AUC of each
model-level statistic over models.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import Field, field_validator

from modelward.backdoor.detect.data.base import roc_auc
from modelward.backdoor.detect.input.strip import STRIP
from modelward.backdoor.experiment import (
    AttackSpec,
    BackdoorConfig,
    DetectOptions,
    ScanOptions,
    Trained,
    box_of,
    defender_split,
    detect_model,
    scan_data,
    train_backdoored,
)
from modelward.backdoor.mitigate.fine_pruning import effect_of, fine_prune
from modelward.backdoor.mitigate.unlearning import unlearn
from modelward.core.config import StrictModel
from modelward.core.data import DataConfig, load_data
from modelward.core.device import DeviceSetting
from modelward.core.io import save_state_dict
from modelward.core.modules import batched_logits
from modelward.core.progress import ProgressSink
from modelward.core.records import write_table
from modelward.core.runner import Execute, RunOutcome, RunSpec
from modelward.core.study import Study, StudyContext, run_study, torch_threads
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig


class DatasetSpec(StrictModel):
    """One data set of the study: its data, architecture, recipe and the attacks planted in it."""

    name: str
    data: DataConfig
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    attacks: list[AttackSpec] = Field(min_length=1)

    @field_validator("attacks")
    @classmethod
    def _distinct(cls, v: list[AttackSpec]) -> list[AttackSpec]:
        names = [a.name for a in v]
        if len(set(names)) != len(names):
            raise ValueError(f"attack names must be distinct within a data set (they name the runs): {names}")
        return v


class StripOptions(StrictModel):
    n: int = Field(20, ge=1)
    frr: float = Field(0.05, gt=0.0, lt=0.5)
    blend: str = "add"


class BackdoorStudyConfig(StrictModel):
    """The study: data sets × (clean seeds + attacks × attack seeds).

    Args:
        datasets: the data sets and their attacks.
        clean_seeds / attack_seeds: the seeds of the clean and of each attack's backdoored models.
        detect, scan: the detectors' options (as ``modelward backdoor``).
        strip: STRIP's options; mitigate_seeds: how many backdoored models per attack are also repaired.
        threads: torch threads per run (1: the runs are small); device; workers / executor: the runner's.
    """

    name: str = "backdoor-detection"
    datasets: list[DatasetSpec] = Field(min_length=1)
    clean_seeds: list[int] = Field(default_factory=lambda: list(range(10)), min_length=1)
    attack_seeds: list[int] = Field(default_factory=lambda: list(range(10)))  # empty: clean models only
    detect: DetectOptions = Field(default_factory=DetectOptions)
    scan: ScanOptions = Field(default_factory=ScanOptions)
    strip: StripOptions = Field(default_factory=StripOptions)
    mitigate_seeds: int = Field(3, ge=0)
    save_models: bool = False  # models/<run>/: the weights and the rows the attack changed (for extensions)
    threads: int | None = Field(1, ge=1)
    device: DeviceSetting = "cpu"
    workers: int = Field(1, ge=1)
    executor: str = "local"


def plan_runs(cfg: BackdoorStudyConfig) -> list[RunSpec]:
    """One run per model (stable ids)."""
    runs = []
    blob = cfg.model_dump_json()
    for ds in cfg.datasets:
        runs += [RunSpec(f"{ds.name}|clean|{s}", {"config": blob, "dataset": ds.name, "attack": None, "seed": s})
                 for s in cfg.clean_seeds]
        for a in ds.attacks:
            runs += [RunSpec(f"{ds.name}|{a.name}|{s}", {"config": blob, "dataset": ds.name, "attack": a.name,
                                                        "seed": s}) for s in cfg.attack_seeds]
    return runs


@dataclass
class RunContext:
    """What a run built, for extensions (the bench adds ART's detectors on the same model)."""

    cfg: BackdoorStudyConfig
    run_cfg: BackdoorConfig
    trained: Trained
    defender: tuple[torch.Tensor, torch.Tensor]
    evaluation: tuple[torch.Tensor, torch.Tensor]


def run_config(cfg: BackdoorStudyConfig, dataset: str, attack: str | None, seed: int) -> BackdoorConfig:
    """The ``modelward backdoor`` config of one run (target class ``seed mod K`` for a backdoored model)."""
    ds = next(d for d in cfg.datasets if d.name == dataset)
    spec = None
    if attack is not None:
        a = next(x for x in ds.attacks if x.name == attack)
        k = load_data(ds.data).num_classes
        spec = a.model_copy(update={"target": seed % k})
    return BackdoorConfig(name=f"{dataset}|{attack or 'clean'}|{seed}", data=ds.data, model=ds.model, train=ds.train,
                          attack=spec, detect=cfg.detect, scan=cfg.scan, seed=seed, device=cfg.device)


def run_folder(out: str | Path, run_id: str) -> Path:
    """Where ``save_models`` keeps a run's model: ``<out>/models/<run id with | as _>``."""
    return Path(out) / "models" / run_id.replace("|", "_")


def save_run_model(folder: Path, trained: Trained) -> None:
    """The weights and the training rows the attack changed (poisoned and cover rows, with their indices)."""
    folder.mkdir(parents=True, exist_ok=True)
    save_state_dict(folder / "model.safetensors", {k: v.cpu() for k, v in trained.model.state_dict().items()})
    if trained.poisoned is not None:
        ps = trained.poisoned
        changed = (ps.poisoned | ps.cover).nonzero().flatten()
        np.savez(folder / "changed_rows.npz", index=changed.numpy(), x=ps.x[changed].numpy(), y=ps.y[changed].numpy(),
                 poisoned=ps.poisoned.numpy(), cover=ps.cover.numpy(), target=np.array(ps.target))


def evaluate_run(spec: dict[str, Any], out: str | Path | None = None, run_id: str | None = None
                 ) -> tuple[dict[str, Any], RunContext]:
    """Train one model and run every detector on it (see the module docstring); returns the result and what was
    built. With ``save_models`` and ``out``, the model is kept under :func:`run_folder`."""
    cfg = BackdoorStudyConfig.model_validate_json(spec["config"])
    seed = int(spec["seed"])
    rc = run_config(cfg, spec["dataset"], spec["attack"], seed)
    data = load_data(rc.data)
    trained = train_backdoored(rc, data)
    model = trained.model
    if cfg.save_models and out is not None and run_id is not None:
        save_run_model(run_folder(out, run_id), trained)
    defender, evaluation = defender_split(data, seed)
    xe, ye = evaluation
    clip = box_of(data)
    res: dict[str, Any] = {"dataset": spec["dataset"], "attack": spec["attack"] or "clean", "seed": seed,
                           "backdoored": spec["attack"] is not None, "train_seconds": trained.seconds}
    res["clean_accuracy"] = float((model_predict(model, xe) == ye).float().mean())
    if trained.effect is not None and trained.attack is not None and trained.poisoned is not None:
        res.update({"target": trained.attack.target, "asr": trained.effect.attack_success_rate,
                    "asr_hits": trained.effect.asr_hits, "asr_n": trained.effect.asr_n,
                    "rows_poisoned": trained.poisoned.n_poisoned})
    # model level
    verdicts, rev = detect_model(model, data, rc.detect, seed)
    for v in verdicts:
        res[v.detector] = {"statistic": v.statistic, "flagged": v.backdoored, "suspect": v.suspect_class,
                           "p_value": v.p_value, "per_class": v.per_class, "seconds": v.seconds}
    # data level
    if trained.poisoned is not None:
        truth = trained.poisoned.poisoned.numpy()
        in_target = (trained.poisoned.y == trained.poisoned.target).numpy()
        res["data"] = {}
        for s in scan_data(model, trained.x_train, trained.y_train, rc.scan, seed):
            res["data"][s.method] = {
                "auc": roc_auc(s.scores, truth), "auc_in_target": roc_auc(s.scores[in_target], truth[in_target]),
                "true_positives": int((s.suspected & truth).sum()), "false_positives": int((s.suspected & ~truth).sum()),
                "poisoned": int(truth.sum()), "seconds": s.seconds}
    # input level
    t0 = time.perf_counter()
    strip = STRIP(n=cfg.strip.n, frr=cfg.strip.frr, blend=cfg.strip.blend, seed=seed, clip=clip).fit(model, defender[0])
    flags_clean, _ = strip.detect(model, xe)
    res["strip"] = {"frr": float(flags_clean.float().mean()), "threshold": strip.threshold}
    if trained.attack is not None:
        keep = ye != trained.attack.target
        flags_bd, _ = strip.detect(model, trained.attack.apply(xe[keep]))
        res["strip"]["tpr"] = float(flags_bd.float().mean())
    res["strip"]["seconds"] = time.perf_counter() - t0
    # mitigation
    if trained.attack is not None and cfg.attack_seeds.index(seed) < cfg.mitigate_seeds and rev is not None:
        nc = next(v for v in verdicts if v.detector == "neural_cleanse")
        measure = effect_of(trained.attack.apply, xe, ye, trained.attack.target)
        ft = rc.train.model_copy(update={"steps": 200, "lr": 0.01, "eval_every": 200, "lr_schedule": []})
        xd, yd = defender
        u = unlearn(model, rev.trigger(nc.suspect_class, clip), xd, yd, xe, ye, finetune=ft, seed=seed,
                    effect=measure)
        f = fine_prune(model, xd, yd, xe, ye, finetune=ft, seed=seed, effect=measure)
        res["mitigation"] = {"unlearning": {"before": u.before, "after": u.after},
                             "fine_pruning": {"before": f.before, "after": f.after,
                                              "pruned": len(f.details["pruned"]),
                                              "channels": f.details["channels"]}}
    return res, RunContext(cfg, rc, trained, defender, evaluation)


def model_predict(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return batched_logits(model, x).argmax(1)


def execute_run(run_id: str, spec: dict[str, Any], deps: dict[str, dict[str, Any]],
                out: str | None = None) -> dict[str, Any]:
    """The runner's entry point for one model (module level: picklable for worker processes)."""
    return evaluate_run(spec, out, run_id)[0]


def _rate(flags: list[bool]) -> float:
    return sum(flags) / len(flags) if flags else float("nan")


def summary_tables(results: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Detection rates per data set × attack, false positives per data set, AUC of the statistics over models.

    Returns:
        ``{"attacks": [...], "clean": [...], "auc": [...], "mitigation": [...]}`` (rows of plain numbers); "either"
        is any of the model-level detectors a run has (the BatchNorm shift only for models with BatchNorm).
    """
    detectors = ("neural_cleanse", "mmbd", "bn_shift")
    attacks, clean, aucs, mitig = [], [], [], []
    for ds in sorted({r["dataset"] for r in results}):
        rs = [r for r in results if r["dataset"] == ds]
        cl = [r for r in rs if not r["backdoored"]]
        row = {"dataset": ds, "models": len(cl),
               "clean_accuracy": float(np.mean([r["clean_accuracy"] for r in cl])) if cl else float("nan")}
        for d in detectors:
            row[f"{d}_fpr"] = _rate([r[d]["flagged"] for r in cl if d in r])
        row["either_fpr"] = _rate([any(r[d]["flagged"] for d in detectors if d in r) for r in cl])
        row["strip_frr"] = float(np.mean([r["strip"]["frr"] for r in cl])) if cl else float("nan")
        clean.append(row)
        for a in sorted({r["attack"] for r in rs if r["backdoored"]}):
            bd = [r for r in rs if r["attack"] == a]
            eff = [r for r in bd if r.get("asr", 0.0) >= 0.5]
            row = {"dataset": ds, "attack": a, "models": len(bd), "effective": len(eff),
                   "clean_accuracy": float(np.mean([r["clean_accuracy"] for r in bd])),
                   "asr": float(np.mean([r["asr"] for r in bd]))}
            for d in detectors:
                row[f"{d}_tpr"] = _rate([r[d]["flagged"] for r in bd if d in r])
                row[f"{d}_target_found"] = _rate([r[d]["flagged"] and r[d]["suspect"] == r["target"]
                                                  for r in bd if d in r])
            row["either_tpr"] = _rate([any(r[d]["flagged"] for d in detectors if d in r) for r in bd])
            row["either_tpr_effective"] = _rate([any(r[d]["flagged"] for d in detectors if d in r) for r in eff])
            for m in sorted({m for r in bd for m in r.get("data", {})}):
                row[f"{m}_auc"] = float(np.mean([r["data"][m]["auc"] for r in bd]))
                row[f"{m}_auc_min"] = float(np.min([r["data"][m]["auc"] for r in bd]))
                row[f"{m}_auc_in_target"] = float(np.mean([r["data"][m]["auc_in_target"] for r in bd]))
            row["strip_tpr"] = float(np.mean([r["strip"]["tpr"] for r in bd]))
            attacks.append(row)
            for r in bd:
                if "mitigation" in r:
                    for meth, m in r["mitigation"].items():
                        mitig.append({"dataset": ds, "attack": a, "seed": r["seed"], "method": meth,
                                      "clean_before": m["before"]["clean_accuracy"],
                                      "clean_after": m["after"]["clean_accuracy"],
                                      "asr_before": m["before"]["attack_success_rate"],
                                      "asr_after": m["after"]["attack_success_rate"]})
            for d in detectors:
                s1 = [r[d]["statistic"] for r in bd if d in r]
                s0 = [r[d]["statistic"] for r in cl if d in r]
                if s1 and s0:
                    aucs.append({"dataset": ds, "attack": a, "detector": d,
                                 "auc": roc_auc(np.r_[s1, s0], np.r_[np.ones(len(s1)), np.zeros(len(s0))].astype(bool)),
                                 "backdoored": len(s1), "clean": len(s0)})
    return {"attacks": attacks, "clean": clean, "auc": aucs, "mitigation": mitig}


def calibrated_tables(results: list[dict[str, Any]], calibration: list[dict[str, Any]]
                      ) -> list[dict[str, Any]]:
    """Detection rates at thresholds calibrated on *other* clean models of the same data set and architecture.

    Each detector's threshold is the largest statistic it gave on the ``calibration`` clean models (n of them): a
    new clean model exceeds the largest of n exchangeable clean statistics with probability 1/(n + 1), so the
    expected false-positive rate is 1/(n + 1) (9 % for n = 10), whatever the statistic's distribution. The rates
    are then counted on ``results`` (models the thresholds never saw).

    Returns:
        Rows per data set × (clean | attack): the threshold of each detector, its rate (FPR on clean, TPR on
        backdoored) and the rate of "either detector".
    """
    detectors = ("neural_cleanse", "mmbd")
    rows = []
    for ds in sorted({r["dataset"] for r in results}):
        cal = [r for r in calibration if r["dataset"] == ds and not r["backdoored"]]
        if not cal:
            continue
        thr = {d: max(r[d]["statistic"] for r in cal) for d in detectors}
        rs = [r for r in results if r["dataset"] == ds]
        for a in ["clean", *sorted({r["attack"] for r in rs if r["backdoored"]})]:
            group = [r for r in rs if r["attack"] == a]
            row: dict[str, Any] = {"dataset": ds, "models": a, "n": len(group), "calibration_models": len(cal)}
            for d in detectors:
                row[f"{d}_threshold"] = thr[d]
                row[f"{d}_rate"] = _rate([r[d]["statistic"] > thr[d] for r in group])
            row["either_rate"] = _rate([any(r[d]["statistic"] > thr[d] for d in detectors) for r in group])
            rows.append(row)
    return rows


class BackdoorStudy(Study[BackdoorStudyConfig, dict[str, list[dict[str, Any]]]]):
    """The detection study in the core frame (one run per model)."""

    name = "backdoor study"
    config_model = BackdoorStudyConfig

    def __init__(self, execute: Callable[..., dict[str, Any]] | None = None) -> None:
        self._execute = execute or execute_run

    @contextmanager
    def session(self, cfg: BackdoorStudyConfig, ctx: StudyContext) -> Iterator[None]:
        with torch_threads(cfg.threads):
            yield

    def plan(self, cfg: BackdoorStudyConfig, ctx: StudyContext) -> list[RunSpec]:
        return plan_runs(cfg)

    def execute(self, cfg: BackdoorStudyConfig, ctx: StudyContext) -> Execute:
        return partial(self._execute, out=str(ctx.out))

    def on_result(self, cfg: BackdoorStudyConfig, ctx: StudyContext) -> Callable[[str, dict[str, Any]], str]:
        def line(rid: str, r: dict[str, Any]) -> str:
            if "clean_accuracy" not in r:  # an extension's run (the bench's ART runs)
                return f"{rid}: done"
            bits = [f"acc {r['clean_accuracy']:.3f}"]
            if "asr" in r:
                bits.append(f"asr {r['asr']:.3f}")
            for d in ("neural_cleanse", "mmbd", "bn_shift"):
                if d in r:
                    bits.append(f"{d} {r[d]['statistic']:.2f}{'*' if r[d]['flagged'] else ''}")
            return f"{rid}: " + ", ".join(bits)
        return line

    def summarize(self, cfg: BackdoorStudyConfig, ctx: StudyContext, outcome: RunOutcome
                  ) -> dict[str, list[dict[str, Any]]]:
        results = [r for r in ctx.ledger.results().values() if isinstance(r, dict) and "dataset" in r]
        tables = summary_tables(results)
        for name, rows in tables.items():
            if rows:
                write_table(ctx.out, f"summary_{name}", rows, title=f"{cfg.name}: {name}")
        return tables


def run_backdoor_study(cfg: BackdoorStudyConfig, out: str | Path, progress: ProgressSink | None = None,
                       execute: Callable[..., dict[str, Any]] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Run (or resume) the study in ``out``; returns :func:`summary_tables` of every finished run.

    Args:
        cfg: the study; out: its folder (one study per folder).
        progress: one unit per model.
        execute: a replacement for :func:`execute_run` (same signature, ``out`` passed by keyword).

    Example:
        >>> run_backdoor_study(cfg, "runs/bench/backdoor")  # doctest: +SKIP
    """
    return run_study(BackdoorStudy(execute), cfg, out, workers=cfg.workers, executor=cfg.executor,
                     progress=progress)


__all__ = ["BackdoorStudyConfig", "DatasetSpec", "calibrated_tables", "RunContext", "evaluate_run", "execute_run", "plan_runs",
           "run_backdoor_study", "summary_tables"]
