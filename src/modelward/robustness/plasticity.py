"""The plasticity study (seed 004 ch. 4–5, §5.4, Table 5.1; digest §7.4 and §9.2).

A shallow and a deep model — plus a parameter-matched control (the shallow architecture widened or narrowed to
the deep model's parameter count, which the thesis does not have; it separates depth from parameter count) — are
trained clean for ``clean_epochs``, then PGD-adversarially trained (Madry, eq 5.2) for ``adv_epochs`` from the
clean weights. After each phase we measure train/test clean accuracy, train/test robust accuracy under an
evaluation PGD attack, and the attack success rate (among test points correct before the attack). Hypothesis 1
predicts that the deep model loses less clean accuracy under adversarial training than the shallow one.

Each model × seed × phase is one run of :func:`modelward.core.runner.run_plan` (the adversarial phase depends on
the clean one and starts from its safetensors checkpoint), so an interrupted study resumes where it stopped. The
library writes the report (``results.csv``/``.md``/``.json``, ``plasticity.png``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from pydantic import Field, model_validator
from torch import nn

from modelward.core.config import StrictModel
from modelward.core.data import DataConfig, DataSplit, load_data
from modelward.core.device import DeviceSetting, resolve_device
from modelward.core.io import load_into, load_state_dict, save_state_dict
from modelward.core.plots import grouped_bars
from modelward.core.progress import ProgressSink, as_sink
from modelward.core.records import write_table
from modelward.core.runner import Execute, RunOutcome, RunSpec
from modelward.core.seed import seeded
from modelward.core.stats import summarize
from modelward.core.study import Study, StudyContext, torch_threads
from modelward.core.study import run_study as run_core_study
from modelward.core.train import TrainConfig, train
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError
from modelward.robustness.attacks.base import attack_mode, predict
from modelward.robustness.attacks.pgd import PGD
from modelward.robustness.training import AdversarialConfig, pgd_adversarial_training

PHASES = ("clean", "adversarial")


class StudyModel(StrictModel):
    name: str
    model: ModelConfig = Field(default_factory=ModelConfig)
    match_params_of: str | None = None  # rescale `model.width` so the parameter count matches that model's


def _default_models() -> list[StudyModel]:
    # §5.4: shallow = 2 conv + max-pool + 2 FC; deep = 3 conv, everything else unchanged
    shallow = ModelConfig(arch="cnn", channels=[32, 64], fc=128, batch_norm=False)
    deep = ModelConfig(arch="cnn", channels=[32, 64, 64], fc=128, batch_norm=False)
    return [StudyModel(name="shallow", model=shallow), StudyModel(name="deep", model=deep),
            StudyModel(name="shallow_matched", model=shallow, match_params_of="deep")]


class EvalAttackConfig(StrictModel):
    eps: float = Field(0.1, ge=0.0)
    norm: str = "linf"
    steps: int = Field(20, ge=1)
    restarts: int = Field(1, ge=1)
    train_subset: int = Field(400, ge=10)  # robust train accuracy on this many training points (cost)


class PlasticityConfig(StrictModel):
    """The plasticity study (seed 004 §5.4; ``modelward study plasticity``): clean then adversarial training.

    Args:
        data: the data source.
        models: the compared architectures (default: shallow, deep, shallow with the deep model's parameter count).
        optim: the optimizer schedule of both phases.
        clean_epochs, adv_epochs: epochs of clean pre-training and of adversarial training.
        adversarial: the training adversary; eval_attack: the evaluation attack.
        seeds: one run per model and seed; threads: torch CPU threads.

    Example:
        >>> [m.name for m in PlasticityConfig().models]
        ['shallow', 'deep', 'shallow_matched']
    """

    data: DataConfig = Field(default_factory=DataConfig)
    models: list[StudyModel] = Field(default_factory=_default_models)
    optim: TrainConfig = Field(default_factory=lambda: TrainConfig(optimizer="adam", lr=1e-3, weight_decay=0.0,
                                                                   batch_size=64, eval_every=100))
    clean_epochs: int = Field(12, ge=1)  # thesis: 12
    adv_epochs: int = Field(20, ge=1)  # thesis: 20
    adversarial: AdversarialConfig = Field(default_factory=lambda: AdversarialConfig(eps=0.1, attack_steps=10))
    eval_attack: EvalAttackConfig = Field(default_factory=EvalAttackConfig)
    seeds: list[int] = Field(default_factory=lambda: [0])
    threads: int = Field(1, ge=1)  # torch CPU threads (1 is fastest on a shared box)
    device: DeviceSetting = "cpu"  # where each run trains and is attacked; not in the fingerprint (docs/devices.md)

    @model_validator(mode="after")
    def _check(self) -> PlasticityConfig:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"models: names must be unique, got {names}")
        for m in self.models:
            if m.match_params_of is not None and m.match_params_of not in names:
                raise ValueError(f"models.{m.name}.match_params_of={m.match_params_of!r}: valid: {names}")
        if not self.seeds:
            raise ValueError("seeds: need at least one seed")
        return self


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def resolve_models(cfg: PlasticityConfig, data: DataSplit) -> dict[str, ModelConfig]:
    """Model configs with `match_params_of` controls rescaled (log-grid search over width) to the target count."""
    plain = {m.name: m.model for m in cfg.models}

    def n_params(mc: ModelConfig) -> int:
        return count_params(build_model(mc, data.input_shape, data.num_classes))

    out = {}
    for m in cfg.models:
        if m.match_params_of is None:
            out[m.name] = m.model
            continue
        target = n_params(plain[m.match_params_of])

        def count(w: float, base: ModelConfig = m.model) -> int:
            return n_params(base.model_copy(update={"width": base.width * w}))

        # the count is non-decreasing in width: bisect on a log scale, keep the closest point seen
        lo, hi, best = math.log(0.05), math.log(20.0), 1.0
        for _ in range(30):
            mid = (lo + hi) / 2
            c = count(math.exp(mid))
            if abs(c - target) < abs(count(best) - target):
                best = math.exp(mid)
            lo, hi = (mid, hi) if c < target else (lo, mid)
        out[m.name] = m.model.model_copy(update={"width": m.model.width * best})
    return out


@dataclass(frozen=True)
class Measured:
    train_clean: float
    test_clean: float
    train_robust: float
    test_robust: float
    attack_success: float  # among test points correct before the attack


def measure(model: nn.Module, data: DataSplit, ev: EvalAttackConfig, seed: int) -> Measured:
    g = torch.Generator().manual_seed(seed)
    sub = torch.randperm(len(data.x_train), generator=g)[: ev.train_subset]
    xs, ys = data.x_train[sub], data.y_train[sub]

    def attack(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return PGD(model, ev.eps, None, ev.steps, ev.norm, True, ev.restarts, seed=seed)(x, y).success.cpu()  # type: ignore[arg-type]

    with attack_mode(model):  # predictions come back to the CPU, where the data lives
        tr_clean = float((predict(model, data.x_train).cpu() == data.y_train).float().mean())
        te_ok = predict(model, data.x_test).cpu() == data.y_test
    te_succ = attack(data.x_test, data.y_test)
    tr_succ = attack(xs, ys)
    flipped = (te_ok & te_succ).sum().item()
    return Measured(tr_clean, float(te_ok.float().mean()), float((~tr_succ).float().mean()),
                    float((~te_succ).float().mean()), flipped / max(1, int(te_ok.sum())))


def run_ids(cfg: PlasticityConfig) -> list[tuple[str, dict[str, Any]]]:
    """(run id, spec) of every model × seed × phase, in plan order."""
    return [(f"{m.name}/s{seed}/{phase}", {"model": m.name, "seed": seed, "phase": phase})
            for seed in cfg.seeds for m in cfg.models for phase in PHASES]


def plan(cfg: PlasticityConfig) -> list[RunSpec]:
    """The study's runs: each adversarial phase depends on the clean phase it starts from."""
    return [RunSpec(rid, spec, () if spec["phase"] == "clean" else (rid.rsplit("/", 1)[0] + "/clean",))
            for rid, spec in run_ids(cfg)]


def _steps(epochs: int, n: int, batch_size: int) -> int:
    return epochs * max(1, n // batch_size)


_SETUP: dict[str, tuple[PlasticityConfig, DataSplit, dict[str, ModelConfig]]] = {}


def _setup(cfg_json: str) -> tuple[PlasticityConfig, DataSplit, dict[str, ModelConfig]]:
    """Config, data and resolved model configs, once per process."""
    if cfg_json not in _SETUP:
        cfg = PlasticityConfig.model_validate_json(cfg_json)
        data = load_data(cfg.data)
        if not data.is_image and any(m.model.arch != "mlp" for m in cfg.models):
            raise ConfigError(f"data.source={cfg.data.source!r} is not an image set; use model.arch='mlp'")
        _SETUP[cfg_json] = (cfg, data, resolve_models(cfg, data))
    return _SETUP[cfg_json]


def execute_run(cfg_json: str, out_dir: str, progress: ProgressSink | None, run_id: str, spec: dict[str, Any],
                dep_results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One model × seed × phase (the ``execute`` of :func:`~modelward.core.runner.run_plan`); returns its row.

    The clean phase trains from scratch and leaves ``checkpoints/<model>_s<seed>_clean.safetensors``; the
    adversarial phase starts from it. Training steps are reported to `progress` under the run id.
    """
    cfg, data, models = _setup(cfg_json)
    out = Path(out_dir)
    name, seed, phase = spec["model"], spec["seed"], spec["phase"]
    ckpt = out / "checkpoints" / f"{name}_s{seed}_clean.safetensors"
    n = len(data.x_train)
    total = _steps(cfg.clean_epochs if phase == "clean" else cfg.adv_epochs, n, cfg.optim.batch_size)
    sink = as_sink(progress)
    sink.start(run_id, total, run_id)
    last = [0]

    def tick(step: int, _loss: float) -> None:
        sink.advance(run_id, step - last[0])
        last[0] = step

    with seeded(seed):  # the model's default initialisation draws from the global RNG
        model = build_model(models[name], data.input_shape, data.num_classes).to(resolve_device(cfg.device))
        adv_acc = None
        if phase == "clean":
            tcfg = cfg.optim.model_copy(update={"steps": total})
            train(model, data.x_train, data.y_train, data.x_test, data.y_test, tcfg, seed,
                  on_eval=lambda s, _v: tick(s, 0.0))
            save_state_dict(ckpt, model.state_dict())
        else:
            if not ckpt.exists():
                raise ConfigError(f"{ckpt}: clean checkpoint missing; delete {out} and rerun")
            state, _ = load_state_dict(ckpt)
            load_into(model, state, ckpt)
            tcfg = cfg.optim.model_copy(update={"steps": total})
            res = pgd_adversarial_training(model, data.x_train, data.y_train, tcfg, cfg.adversarial, seed,
                                           on_step=tick)
            adv_acc = res.adv_train_accuracy
        m = measure(model, data, cfg.eval_attack, seed)
    sink.done(run_id)
    return {"model": name, "seed": seed, "phase": phase, "params": count_params(model),
            "n_conv": len(models[name].channels) if models[name].arch == "cnn" else None,
            "width": models[name].width, **m.__dict__, "adv_train_batches_acc": adv_acc}


class PlasticityStudy(Study[PlasticityConfig, list[dict[str, Any]]]):
    """The plasticity study in the core frame: one run per model × seed × phase, then the report."""

    name = "plasticity"
    config_model = PlasticityConfig
    config_file = None  # the folder's config is the ledger's fingerprint (as before the shared frame)
    fail_fast = True

    def legacy_fingerprints(self, cfg: PlasticityConfig) -> tuple[str, ...]:
        # folders from before the fingerprint was hashed recorded the config's JSON itself
        return (json.dumps(cfg.model_dump(mode="json", exclude={"device"}), sort_keys=True),)

    @contextmanager
    def session(self, cfg: PlasticityConfig, ctx: StudyContext) -> Iterator[None]:
        (ctx.out / "checkpoints").mkdir(parents=True, exist_ok=True)
        cfg_json = cfg.model_dump_json()
        with torch_threads(cfg.threads):
            try:
                _setup(cfg_json)  # config errors (data vs architecture) before any run starts
                yield
            finally:
                _SETUP.pop(cfg_json, None)

    def plan(self, cfg: PlasticityConfig, ctx: StudyContext) -> list[RunSpec]:
        return plan(cfg)

    def execute(self, cfg: PlasticityConfig, ctx: StudyContext) -> Execute:
        # a progress sink (rich bars) cannot travel to other processes: per-step progress only in process
        return partial(execute_run, cfg.model_dump_json(), str(ctx.out), ctx.progress if ctx.in_process else None)

    def summarize(self, cfg: PlasticityConfig, ctx: StudyContext, outcome: RunOutcome) -> list[dict[str, Any]]:
        results = ctx.ledger.results()
        rows = [results[rid] for rid, _ in run_ids(cfg) if rid in results]
        write_report(cfg, rows, ctx.out)
        return rows


def run_study(cfg: PlasticityConfig, out: str | Path, progress: ProgressSink | None = None, *, workers: int = 1,
              executor: str = "local", address: str | None = None) -> list[dict[str, Any]]:
    """Run (or resume) every model × seed × phase and write the report; returns the result rows (one per run).

    Args:
        cfg: the study.
        out: the study folder (``ledger.sqlite``, ``checkpoints/``, ``results.{csv,md,json}``, ``plasticity.png``).
        progress: one unit per run under ``"plasticity"``, and each run's training steps under its run id (the
            latter only when runs execute in this process).
        workers, executor, address: where runs execute (:func:`modelward.core.runner.run_plan`; ``"ray"`` for a
            cluster).

    Returns:
        One result row per run (:func:`modelward.core.study.run_study` over :class:`PlasticityStudy`).
    """
    return run_core_study(PlasticityStudy(), cfg, out, workers=workers, executor=executor, address=address,
                          progress=progress)


METRICS = [("train_clean", "Train accuracy"), ("test_clean", "Test accuracy"),
           ("train_robust", "Train robust accuracy"), ("test_robust", "Test robust accuracy"),
           ("attack_success", "Attack success rate")]


def summarise(rows: list[dict[str, Any]]) -> dict[tuple[str, str, str], tuple[float, float]]:
    """(model, phase, metric) -> (mean, sample SD over seeds; 0 for one seed) in percent."""
    groups: dict[tuple[str, str, str], list[float]] = {}
    for r in rows:
        for key, _ in METRICS:
            groups.setdefault((r["model"], r["phase"], key), []).append(100.0 * r[key])
    out = {}
    for k, v in groups.items():
        st = summarize(v)
        out[k] = (st.mean, st.sd if st.n > 1 else 0.0)  # 0 for one seed: no error bar (the table hides it)
    return out


def table_markdown(rows: list[dict[str, Any]], cfg: PlasticityConfig) -> str:
    """Table 5.1 layout: conditions as rows, models as columns (mean ± SD over seeds, percent)."""
    s = summarise(rows)
    names = [m.name for m in cfg.models]
    params = {r["model"]: r["params"] for r in rows}
    lines = ["| Condition | " + " | ".join(f"{n} ({params.get(n, '?')} params)" for n in names) + " |",
             "|---|" + "---|" * len(names)]
    for phase, label in (("clean", ""), ("adversarial", " (post adversarial training)")):
        for key, title in METRICS:
            cells = []
            for n in names:
                if (n, phase, key) in s:
                    mean, sd = s[(n, phase, key)]
                    cells.append(f"{mean:.2f}" + (f" ± {sd:.2f}" if len(cfg.seeds) > 1 else ""))
                else:
                    cells.append("—")
            lines.append(f"| {title}{label} | " + " | ".join(cells) + " |")
    cost = []
    for n in names:
        if (n, "clean", "test_clean") in s and (n, "adversarial", "test_clean") in s:
            cost.append(f"{s[(n, 'clean', 'test_clean')][0] - s[(n, 'adversarial', 'test_clean')][0]:.2f}")
        else:
            cost.append("—")
    lines.append("| AT accuracy cost (test clean before − after) | " + " | ".join(cost) + " |")
    ev = cfg.eval_attack
    lines += ["", f"Robust accuracy / attack success: PGD-{ev.steps} {ev.norm} ε={ev.eps} "
              f"({ev.restarts} restart(s)); adversarial training: PGD-{cfg.adversarial.attack_steps} "
              f"ε={cfg.adversarial.eps}; {cfg.clean_epochs} clean + {cfg.adv_epochs} adversarial epochs; "
              f"seeds {cfg.seeds}. Attack success counts among test points correct before the attack."]
    return "\n".join(lines) + "\n"


def write_report(cfg: PlasticityConfig, rows: list[dict[str, Any]], out: str | Path) -> dict[str, Path]:
    """``results.csv`` / ``results.json`` (one row per run), ``results.md`` (Table 5.1 layout) and
    ``plasticity.png`` (bars per model × phase) in `out`; returns the paths."""
    out = Path(out)
    md = "# Plasticity study (seed 004 §5.4, Table 5.1 layout)\n\n" + table_markdown(rows, cfg)
    paths = write_table(out, "results", rows, markdown=md)
    s = summarise(rows)
    groups = [(m.name, p) for m in cfg.models for p in PHASES]
    series = {title: ([s.get((g[0], g[1], key), (0.0, 0.0))[0] for g in groups],
                      [s.get((g[0], g[1], key), (0.0, 0.0))[1] for g in groups])
              for key, title in METRICS}
    grouped_bars(out / "plasticity.png", [f"{n}\n{p}" for n, p in groups], series,
                 "Plasticity study: before / after PGD training", "%", (0.0, 100.0))
    return {**paths, "png": out / "plasticity.png"}
