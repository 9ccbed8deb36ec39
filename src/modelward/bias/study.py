"""A bias study (seed 002 Ch. 9) as data: a TOML config → runs through the shared runner → results tables.

Three kinds of work, each optional:

- ``[[datasets]]`` — B_D(h_S) and accuracy before and after each mitigation, averaged over stratified splits
  (Table 9.2 with ``learner = "gaussian_nb"``; Table 9.6 with ``learner = "sgd"``; ``kind = "deep"`` trains a zoo
  CNN on a class pair and mitigates its penultimate-layer linear head, Table 9.6's first rows);
- ``[theorem]`` — Theorem 9.1's closed form against a Monte-Carlo estimate of the Bayes-optimal predictor's bias;
- ``[sweep]`` — Fig. 9.3a/c: bias and signed weak-weight error vs the number of weak features, per training size.

One run = one (data set, split), one theorem check, or one (N, #weak) sweep cell; the runner records each in the
ledger, so an interrupted study resumes where it stopped.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from modelward.bias.amplification import (
    GaussianSetting,
    LinearModel,
    asymmetric_gaussian,
    asymmetry,
    bayes_optimal,
    bias_amplification,
    majority_as_one,
    theorem_9_1,
    weak_weight_error,
)
from modelward.bias.data import binarize, load_arrays
from modelward.bias.learners import SGDSchedule, fit_learner, fit_sgd, linear_head, penultimate_features
from modelward.bias.mitigation import BiasAdjust, experts, feature_parity
from modelward.core.config import StrictModel
from modelward.core.data import DataConfig
from modelward.core.device import DeviceSetting, resolve_device
from modelward.core.init import init_model_
from modelward.core.progress import ProgressSink
from modelward.core.records import write_table
from modelward.core.runner import Execute, RunOutcome, RunSpec
from modelward.core.seed import seeded
from modelward.core.stats import summarize
from modelward.core.study import Study, StudyContext, run_study
from modelward.core.train import TrainConfig, train
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError

Mitigation = Literal["parity", "experts", "l1"]
MITIGATIONS: tuple[str, ...] = ("parity", "experts", "l1")


class SyntheticSpec(StrictModel):
    """Eq. 9.11 data: one strong feature per class (variance ``strong_var``), ``n_weak`` weak features of
    variance ``weak_var`` oriented towards class 1, prior ``p``, ``n_samples`` instances per split."""

    n_samples: int = Field(100, ge=8)
    n_weak: int = Field(1000, ge=0)
    weak_var: float = Field(3.0, gt=0.0)
    strong_var: float = Field(1.0, gt=0.0)
    p: float = Field(0.5, gt=0.0, lt=1.0)


class DatasetSpec(StrictModel):
    """One row of the results: where the data comes from, the learner, the mitigations."""

    name: str
    kind: Literal["synthetic", "tabular", "deep"] = "tabular"
    synthetic: SyntheticSpec = SyntheticSpec()
    data: DataConfig = DataConfig(source="breast_cancer")  # tabular / deep (core.data sources and files)
    mat_path: str | None = None  # a scikit-feature .mat file (X, Y) instead of [data]
    classes: list[str | int] | None = None  # binary pair (e.g. digits [3, 8]); default: the two labels
    learner: Literal["sgd", "lbfgs_logistic", "linear_svm", "gaussian_nb"] = "sgd"
    sgd: SGDSchedule = SGDSchedule()
    svm_c: float = Field(1.0, gt=0.0)
    splits: int = Field(20, ge=1)
    test_fraction: float = Field(0.25, gt=0.0, lt=1.0)
    standardize: bool = True  # tabular: z-score with each split's training statistics
    mitigations: list[Mitigation] = Field(default_factory=lambda: ["parity", "experts", "l1"])
    l1_alpha: float = Field(0.1, gt=0.0)
    parity_bias_adjust: BiasAdjust = "subtract"
    experts_bias_adjust: BiasAdjust = "none"
    experts_grid: int = Field(64, ge=2)
    # deep: a zoo model trained on the pair, sliced at its penultimate layer
    model: ModelConfig = ModelConfig(arch="cnn", channels=[16, 32], fc=64)
    train: TrainConfig = TrainConfig(steps=300, lr=0.05, eval_every=100)

    @model_validator(mode="after")
    def _check(self) -> DatasetSpec:
        if self.learner == "gaussian_nb" and self.mitigations:
            raise ValueError("mitigations need a linear model; gaussian_nb supports none (set mitigations = [])")
        if self.kind == "deep" and "l1" in self.mitigations:
            raise ValueError("l1 is a training-time mitigation of linear models; for kind='deep' use "
                             "'parity' and 'experts' (as in Table 9.6)")
        if self.classes is not None and len(self.classes) != 2:
            raise ValueError("classes: give exactly two labels, e.g. [3, 8]")
        if len(set(self.mitigations)) != len(self.mitigations):
            raise ValueError("mitigations: each at most once")
        return self


class TheoremSpec(StrictModel):
    """Theorem 9.1 vs Monte-Carlo: for each (p, D) a diagonal Gaussian with that Mahalanobis distance."""

    cases: list[tuple[float, float]] = Field(default_factory=lambda: [(0.5, 1.0), (0.6, 1.0), (0.7, 1.0),
                                                                       (0.75, 0.5), (0.7, 2.0), (0.9, 1.5)])
    samples: int = Field(400_000, ge=1000)
    dims: int = Field(3, ge=1)


class SweepSpec(StrictModel):
    """Fig. 9.3a/c: bias and weak-weight error vs the number of weak features, for each training size; Fig. 9.3b
    (when ``weak_vars`` is not empty): bias vs the weak features' variance at ``variance_sweep_n_weak`` features."""

    n_weak: list[int] = Field(default_factory=lambda: [0, 16, 64, 256, 1024])
    train_sizes: list[int] = Field(default_factory=lambda: [100, 500, 1000])
    weak_var: float = Field(10.0, gt=0.0)
    strong_var: float = Field(1.0, gt=0.0)
    runs: int = Field(20, ge=1)
    test_samples: int = Field(2000, ge=100)
    sgd: SGDSchedule = SGDSchedule()
    weak_vars: list[float] = Field(default_factory=list)  # Fig. 9.3b: e.g. [1, 2, 5, 10, 20, 50, 100]
    variance_sweep_n_weak: int = Field(256, ge=1)


class BiasConfig(StrictModel):
    """``modelward bias CONFIG``: any of datasets / theorem / sweep."""

    datasets: list[DatasetSpec] = Field(default_factory=list)
    theorem: TheoremSpec | None = None
    sweep: SweepSpec | None = None
    seed: int = 0
    workers: int = Field(1, ge=1)
    device: DeviceSetting = "cpu"  # where kind="deep" nets train (docs/devices.md); not part of the study's fingerprint

    @model_validator(mode="after")
    def _some_work(self) -> BiasConfig:
        if not self.datasets and self.theorem is None and self.sweep is None:
            raise ValueError("nothing to do: add [[datasets]], [theorem] or [sweep]")
        names = [d.name for d in self.datasets]
        if len(set(names)) != len(names):
            raise ValueError(f"datasets: names must be unique, got {names}")
        return self


def _seed(*parts: object) -> int:
    return int(hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:8], 16)


# ------------------------------------------------------------------------------------------------------------
# one data-set split
def _split(x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, ...]:
    from sklearn.model_selection import train_test_split

    return tuple(train_test_split(x, y, test_size=test_fraction, stratify=y, random_state=seed))


def _evaluate(model: LinearModel, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    pred = model.predict(x)
    return {"bias": bias_amplification(pred, y), "acc": float(np.mean(pred == y))}


def _dataset_arrays(ds: DatasetSpec, split: int, base_seed: int) -> tuple[np.ndarray, np.ndarray]:
    if ds.kind == "synthetic":
        s = ds.synthetic
        setting = asymmetric_gaussian(s.n_weak, s.weak_var, s.strong_var, s.p)
        return setting.sample(s.n_samples, np.random.default_rng(_seed(base_seed, ds.name, split)), balanced=True)
    x, y, _ = load_arrays(ds.data, ds.mat_path)
    classes = None if ds.classes is None else (ds.classes[0], ds.classes[1])
    yb, keep = binarize(y, classes, where=ds.name)
    yb, _ = majority_as_one(yb)  # Def. 9.1: class 1 is the majority (p* >= 1/2)
    return x[keep], yb


def _linear_run(ds: DatasetSpec, xtr: np.ndarray, xte: np.ndarray, ytr: np.ndarray, yte: np.ndarray,
                seed: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    fitted = fit_learner(ds.learner, xtr, ytr, ds.sgd, seed, ds.svm_c)
    if ds.learner == "gaussian_nb":
        pred = fitted.predict(xte)
        out["none"] = {"bias": bias_amplification(pred, yte), "acc": float(np.mean(pred == yte))}
        return out
    model = fitted.model
    out["none"] = _evaluate(model, xte, yte)
    means = xtr.mean(0)
    if "parity" in ds.mitigations:
        m = feature_parity(model, means, ds.parity_bias_adjust)
        out["parity"] = _evaluate(m.model, xte, yte) | {"removed": m.info["removed"]}
    if "experts" in ds.mitigations:
        m = experts(model, xtr, ytr, means, ds.experts_bias_adjust, ds.experts_grid)
        out["experts"] = _evaluate(m.model, xte, yte) | {"alpha": m.info["alpha"], "beta": m.info["beta"]}
    if "l1" in ds.mitigations:
        sched = ds.sgd.model_copy(update={"penalty": "l1", "alpha": ds.l1_alpha})
        out["l1"] = _evaluate(fit_sgd(xtr, ytr, sched, seed).model, xte, yte)
    return out


def _deep_run(ds: DatasetSpec, xtr: np.ndarray, xte: np.ndarray, ytr: np.ndarray, yte: np.ndarray,
              seed: int, device: str = "cpu") -> dict[str, Any]:
    import torch

    xt_tr = torch.as_tensor(xtr, dtype=torch.float32)
    xt_te = torch.as_tensor(xte, dtype=torch.float32)
    yt_tr, yt_te = torch.as_tensor(ytr), torch.as_tensor(yte)
    with seeded(seed):  # module constructors draw from the global RNG; forked and restored
        net = build_model(ds.model, tuple(xt_tr.shape[1:]), 2)
    net = init_model_(net, "glorot_uniform", seed).to(resolve_device(device))
    train(net, xt_tr, yt_tr, xt_te, yt_te, ds.train, seed)
    net.eval()
    ztr, zte = penultimate_features(net, xt_tr), penultimate_features(net, xt_te)
    head = linear_head(net, (0, 1))
    # for a deep net the "features" are the latent units (Table 9.6's asymm. for CIFAR/CelebA)
    out: dict[str, Any] = {"none": _evaluate(head, zte, yte), "asymm": asymmetry(ztr, ytr),
                           "asymm_weights": float(np.mean(head.w > 0)), "train_acc": _evaluate(head, ztr, ytr)["acc"]}
    means = ztr.mean(0)
    if "parity" in ds.mitigations:
        m = feature_parity(head, means, ds.parity_bias_adjust)
        out["parity"] = _evaluate(m.model, zte, yte) | {"removed": m.info["removed"]}
    if "experts" in ds.mitigations:
        m = experts(head, ztr, ytr, means, ds.experts_bias_adjust, ds.experts_grid)
        out["experts"] = _evaluate(m.model, zte, yte) | {"alpha": m.info["alpha"], "beta": m.info["beta"]}
    return out


def run_dataset_split(ds: DatasetSpec, split: int, base_seed: int = 0, device: str = "cpu") -> dict[str, Any]:
    """One stratified split of one data set: p*, asymmetry, and B / accuracy per mitigation (on the test part)."""
    x, y = _dataset_arrays(ds, split, base_seed)
    seed = _seed(base_seed, ds.name, "split", split) % (2**31)
    xtr, xte, ytr, yte = _split(x, y, ds.test_fraction, seed)
    res: dict[str, Any] = {"p": float(np.mean(y)), "n_train": len(ytr), "n_test": len(yte)}
    flat_tr = xtr.reshape(len(xtr), -1)
    res["asymm"] = asymmetry(flat_tr, ytr)
    if ds.kind == "deep":
        return res | _deep_run(ds, xtr, xte, ytr, yte, seed, device)
    xtr, xte = flat_tr, xte.reshape(len(xte), -1)
    if ds.kind == "tabular" and ds.standardize:
        mu, sd = xtr.mean(0), xtr.std(0)
        sd[sd == 0] = 1.0
        xtr, xte = (xtr - mu) / sd, (xte - mu) / sd
    return res | _linear_run(ds, xtr, xte, ytr, yte, seed)


# ------------------------------------------------------------------------------------------------------------
def run_theorem_case(p: float, distance: float, samples: int, dims: int, seed: int) -> dict[str, Any]:
    """Theorem 9.1 vs the Monte-Carlo bias of the Bayes-optimal predictor on a diagonal Gaussian with
    Mahalanobis distance D (the mean gap split evenly over `dims` unit-variance features)."""
    gap = distance / math.sqrt(dims)
    setting = GaussianSetting(p, np.zeros(dims), np.full(dims, gap), np.ones(dims))
    x, y = setting.sample(samples, np.random.default_rng(seed))
    pred = bayes_optimal(setting).predict(x)
    mc = bias_amplification(pred, y)
    # SE of mean(pred − y)
    se = float(np.std(pred - y, ddof=1) / math.sqrt(samples))
    return {"p": p, "D": distance, "theorem": theorem_9_1(p, distance), "monte_carlo": mc, "se": se,
            "pred_1_rate": float(pred.mean())}


def run_sweep_cell(n_weak: int, n_train: int, spec: SweepSpec, seed: int, weak_var: float | None = None
                   ) -> dict[str, Any]:
    """Fig. 9.3a/c cell (9.3b with ``weak_var``): mean test bias and signed weak-weight error of SGD logistic
    regression over `runs` training sets of size `n_train`."""
    var = spec.weak_var if weak_var is None else weak_var
    setting = asymmetric_gaussian(n_weak, var, spec.strong_var, 0.5)
    opt = bayes_optimal(setting)
    biases, errors, accs = [], [], []
    for r in range(spec.runs):
        rng = np.random.default_rng(_seed(seed, n_weak, n_train, r) if weak_var is None
                                    else _seed(seed, n_weak, n_train, r, var))
        xtr, ytr = setting.sample(n_train, rng, balanced=True)
        xte, yte = setting.sample(spec.test_samples, rng, balanced=True)
        m = fit_sgd(xtr, ytr, spec.sgd, seed=r).model
        biases.append(bias_amplification(m.predict(xte), yte))
        accs.append(float(np.mean(m.predict(xte) == yte)))
        if n_weak > 0:
            errors.append(weak_weight_error(m.w, opt.w))
    spread = summarize(biases)  # the house's "over seeds" statistic: the sample SD (0 for a single run)
    return {"n_weak": n_weak, "n_train": n_train, "weak_var": var, "bias": float(np.mean(biases)),
            "bias_sd": spread.sd if spread.n > 1 else 0.0,
            "acc": float(np.mean(accs)), "weak_weight_error": float(np.mean(errors)) if errors else None,
            "runs": spec.runs}


def execute(run_id: str, spec: dict[str, Any], deps: dict[str, dict[str, Any]], device: str = "cpu"
            ) -> dict[str, Any]:
    """The runner's entry point (module level, picklable; bind ``device`` with functools.partial): one run of the
    plan built by :func:`plan`."""
    kind = spec["kind"]
    if kind == "split":
        return run_dataset_split(DatasetSpec.model_validate(spec["dataset"]), spec["split"], spec["seed"], device)
    if kind == "theorem":
        return run_theorem_case(spec["p"], spec["D"], spec["samples"], spec["dims"], spec["seed"])
    if kind == "sweep":
        return run_sweep_cell(spec["n_weak"], spec["n_train"], SweepSpec.model_validate(spec["sweep"]), spec["seed"],
                              spec.get("weak_var"))
    raise ConfigError(f"run {run_id}: unknown kind {kind!r}")


def plan(cfg: BiasConfig) -> list[Any]:
    """The study's runs as :class:`~modelward.core.runner.RunSpec` (stable ids: resuming re-plans the same)."""
    runs: list[RunSpec] = []
    for ds in cfg.datasets:
        d = ds.model_dump(mode="json")
        runs += [RunSpec(f"ds|{ds.name}|{i:03d}", {"kind": "split", "dataset": d, "split": i, "seed": cfg.seed})
                 for i in range(ds.splits)]
    if cfg.theorem is not None:
        t = cfg.theorem
        runs += [RunSpec(f"theorem|{p}|{dist}", {"kind": "theorem", "p": p, "D": dist, "samples": t.samples,
                                                  "dims": t.dims, "seed": _seed(cfg.seed, "theorem", p, dist) % 2**31})
                 for p, dist in t.cases]
    if cfg.sweep is not None:
        s = cfg.sweep.model_dump(mode="json")
        runs += [RunSpec(f"sweep|{n}|{w:05d}", {"kind": "sweep", "n_weak": w, "n_train": n, "sweep": s,
                                                 "seed": cfg.seed})
                 for n in cfg.sweep.train_sizes for w in cfg.sweep.n_weak]
        runs += [RunSpec(f"sweepvar|{n}|{v:g}", {"kind": "sweep", "n_weak": cfg.sweep.variance_sweep_n_weak,
                                                 "n_train": n, "sweep": s, "seed": cfg.seed, "weak_var": v})
                 for n in cfg.sweep.train_sizes for v in cfg.sweep.weak_vars]
    return runs


# ------------------------------------------------------------------------------------------------------------
def summarize_results(cfg: BiasConfig, results: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Aggregate the ledger's results into the tables: ``results`` (data set × mitigation), ``theorem``,
    ``sweep``."""
    rows: list[dict[str, Any]] = []
    for ds in cfg.datasets:
        rs = [results[k] for k in sorted(results) if k.startswith(f"ds|{ds.name}|")]
        if not rs:
            continue
        for mit in ["none", *ds.mitigations]:
            vals = [r[mit] for r in rs if mit in r]
            b, a = summarize(v["bias"] for v in vals), summarize(v["acc"] for v in vals)
            row = {"dataset": ds.name, "mitigation": mit, "learner": ds.learner if ds.kind != "deep" else "deep head",
                   "p": float(np.mean([r["p"] for r in rs])), "asymm": float(np.mean([r["asymm"] for r in rs])),
                   "bias": b.mean, "bias_sd": b.sd, "acc": a.mean, "acc_sd": a.sd, "splits": b.n}
            if mit == "experts":
                row["alpha_mean"] = float(np.mean([v["alpha"] for v in vals]))
                row["beta_mean"] = float(np.mean([v["beta"] for v in vals]))
            rows.append(row)
    theorem = [results[k] for k in sorted(results) if k.startswith("theorem|")]
    for t in theorem:
        t["z"] = (t["monte_carlo"] - t["theorem"]) / t["se"] if t["se"] > 0 else 0.0
    sweep = [results[k] for k in results if k.startswith("sweep|")]
    sweep.sort(key=lambda r: (r["n_train"], r["n_weak"]))
    sweep_var = [results[k] for k in results if k.startswith("sweepvar|")]
    sweep_var.sort(key=lambda r: (r["n_train"], r["weak_var"]))
    return {"results": rows, "theorem": theorem, "sweep": sweep, "sweep_variance": sweep_var}


def write_outputs(out: Path, cfg: BiasConfig, tables: dict[str, list[dict[str, Any]]]) -> list[Path]:
    """results.csv/md/json (+ theorem.*, sweep.*) and the plots."""
    from modelward.core.plots import grouped_bars, line_plot  # matplotlib on first figure only

    written: list[Path] = []
    rows = tables["results"]
    if rows:
        cols = ["dataset", "learner", "mitigation", "p", "asymm", "bias", "bias_sd", "acc", "acc_sd", "splits"]
        written += write_table(out, "results", rows, [*cols, *(c for c in ("alpha_mean", "beta_mean")
                                                              if any(c in r for r in rows))],
                               title="Bias amplification B_D(h_S) and test accuracy per mitigation (seed 002 §9.3)",
                               notes=["B = Pr[F(x)=1] − p* on the test split, class 1 = majority (Def. 9.1);",
                                      "mean and sample SD over the stratified splits."]).values()
        names = [d.name for d in cfg.datasets]
        mits = ["none", *MITIGATIONS]
        for metric, ylabel in (("bias", "bias amplification B"), ("acc", "test accuracy")):
            series = {}
            for mit in mits:
                vals = [next((r[metric] for r in rows if r["dataset"] == n and r["mitigation"] == mit), math.nan)
                        for n in names]
                sds = [next((r[f"{metric}_sd"] for r in rows if r["dataset"] == n and r["mitigation"] == mit), 0.0)
                       for n in names]
                if not all(math.isnan(v) for v in vals):
                    series[mit] = (vals, [0.0 if math.isnan(s) else s for s in sds])
            written.append(grouped_bars(out / f"{metric}_by_mitigation.png", names, series,
                                        f"{ylabel} per mitigation", ylabel))
    if tables["theorem"]:
        written += write_table(out, "theorem", tables["theorem"],
                               ["p", "D", "theorem", "monte_carlo", "se", "z", "pred_1_rate"],
                               title="Theorem 9.1 (corrected sign) vs Monte-Carlo bias of the Bayes-optimal predictor",
                               notes=["z = (MC − theorem) / SE; |z| < 3 means agreement to sampling error."]
                               ).values()
    if tables["sweep"]:
        sweep = tables["sweep"]
        written += write_table(out, "sweep", sweep, ["n_train", "n_weak", "bias", "bias_sd", "acc",
                                                     "weak_weight_error", "runs"],
                               title="Fig. 9.3a/c: SGD logistic regression on Eq. 9.11 data").values()
        sizes = sorted({r["n_train"] for r in sweep})
        series = {f"N = {n}": ([r["n_weak"] for r in sweep if r["n_train"] == n],
                               [r["bias"] for r in sweep if r["n_train"] == n]) for n in sizes}
        written.append(line_plot(out / "sweep_bias.png", series, "Fig. 9.3a: bias vs number of weak features",
                                 "number of weak features", "bias amplification B"))
        weak = sorted({r["n_weak"] for r in sweep if r["weak_weight_error"] is not None})
        series = {f"{w} weak features": ([r["n_train"] for r in sweep if r["n_weak"] == w],
                                         [r["weak_weight_error"] for r in sweep if r["n_weak"] == w]) for w in weak}
        written.append(line_plot(out / "sweep_weak_weight_error.png", series,
                                 "Fig. 9.3c: signed weak-weight error (ŵ − w*) vs training size",
                                 "training size N", "mean (ŵ − w*) over weak features", logx=True))
    if tables.get("sweep_variance"):
        sv = tables["sweep_variance"]
        written += write_table(out, "sweep_variance", sv, ["n_train", "n_weak", "weak_var", "bias", "bias_sd", "acc",
                                                           "weak_weight_error", "runs"],
                               title="Fig. 9.3b: bias vs the weak features' variance (SGD logistic regression)").values()
        sizes = sorted({r["n_train"] for r in sv})
        series = {f"N = {n}": ([r["weak_var"] for r in sv if r["n_train"] == n],
                               [r["bias"] for r in sv if r["n_train"] == n]) for n in sizes}
        written.append(line_plot(out / "sweep_variance.png", series,
                                 f"Fig. 9.3b: bias vs weak-feature variance ({sv[0]['n_weak']} weak features)",
                                 "weak-feature variance", "bias amplification B", logx=True))
    return written


@dataclass
class BiasOutcome:
    """What :func:`run_bias` achieved: the ``tables`` (``results``, ``theorem``, ``sweep``, ``sweep_variance``
    rows), the files ``written``, and the runner's ``done`` / ``total`` / ``failed`` (run id -> error; failed runs
    restart when the study is run again)."""

    tables: dict[str, list[dict[str, Any]]]
    written: list[Path]
    done: int
    total: int
    failed: dict[str, str] = field(default_factory=dict)


class BiasStudy(Study[BiasConfig, BiasOutcome]):
    """The bias study in the core frame: one run per data set × split, Theorem 9.1 case and sweep cell."""

    name = "bias runs"
    config_model = BiasConfig

    def check(self, cfg: BiasConfig, out: Path) -> None:
        resolve_device(cfg.device)  # an unusable device is refused before any run starts

    def plan(self, cfg: BiasConfig, ctx: StudyContext) -> list[RunSpec]:
        return plan(cfg)

    def execute(self, cfg: BiasConfig, ctx: StudyContext) -> Execute:
        return functools.partial(execute, device=cfg.device)

    def summarize(self, cfg: BiasConfig, ctx: StudyContext, outcome: RunOutcome) -> BiasOutcome:
        tables = summarize_results(cfg, ctx.ledger.results())
        written = write_outputs(ctx.out, cfg, tables)
        return BiasOutcome(tables, written, outcome.done, outcome.total, outcome.failed)


def run_bias(cfg: BiasConfig, out: str | Path, progress: ProgressSink | None = None, *, workers: int | None = None,
             executor: str = "local", address: str | None = None) -> BiasOutcome:
    """Run (or resume) the bias study in `out`: B_D(h) and accuracy per data set and mitigation, Theorem 9.1 vs
    Monte-Carlo, the Fig. 9.3 sweep; writes ``results.*``, ``theorem.*``, ``sweep.*`` and the plots.

    Args:
        cfg: the study (:class:`BiasConfig`).
        out: the study folder (``ledger.sqlite``, ``config.json``, the tables); re-running resumes it.
        progress: one unit per run under ``"bias runs"``.
        workers: parallel runs (default: ``cfg.workers``); executor, address: see
            :func:`modelward.core.runner.run_plan`.

    Returns:
        :class:`BiasOutcome`.

    Example:
        >>> from modelward.core.config import load_config
        >>> cfg = load_config("examples/bias_synthetic.toml", BiasConfig)  # doctest: +SKIP
        >>> run_bias(cfg, "runs/bias").tables["results"][0]["bias"]  # doctest: +SKIP
    """
    return run_study(BiasStudy(), cfg, out, workers=workers or cfg.workers, executor=executor, address=address,
                     progress=progress)
