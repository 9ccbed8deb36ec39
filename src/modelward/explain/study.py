"""``modelward explain CONFIG --out DIR`` as data: models × (input attributions, top internal units per class),
then a comparison across models. Runs go through the shared runner (resumable); every table is CSV/MD/JSON and
every picture a PNG grid.

Models are checkpoints written by ``modelward train`` (a zoo model) or ``modelward robust train`` (e.g. a GloRo
net: its underlying logit model ``f`` is explained), or are trained here from ``[models.model]`` /
``[models.train]`` (saved under ``OUT/models/``).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import Field, model_validator
from torch import nn

from modelward.core.checkpoint import load_checkpoint as core_load_checkpoint
from modelward.core.config import StrictModel
from modelward.core.data import DataConfig, DataSplit, load_data
from modelward.core.device import DeviceSetting, resolve_device
from modelward.core.io import save_state_dict, save_tensors
from modelward.core.progress import ProgressSink
from modelward.core.records import write_table
from modelward.core.runner import Execute, RunOutcome, RunSpec
from modelward.core.study import Study, StudyContext, run_study
from modelward.core.train import TrainConfig, fit_from_config
from modelward.core.zoo import ModelConfig
from modelward.errors import ConfigError
from modelward.explain.influence import ClassQoI
from modelward.explain.interpret import (
    METHODS,
    Method,
    attribute,
    compare_models,
    concentration,
    top_units,
    unit_attribution,
    unit_inversion,
)
from modelward.explain.layers import feature_layer
from modelward.explain.methods import saliency


class ModelEntry(StrictModel):
    """One model to explain: a checkpoint ``path``, or a zoo ``model`` trained here with ``train``."""

    name: str
    path: str | None = None
    model: ModelConfig | None = None
    train: TrainConfig = TrainConfig(steps=400, eval_every=100)
    seed: int = 0

    @model_validator(mode="after")
    def _one_source(self) -> ModelEntry:
        if (self.path is None) == (self.model is None):
            raise ValueError(f"model {self.name!r}: give exactly one of 'path' (a checkpoint) or a [model] table")
        return self


class ExplainSettings(StrictModel):
    """What to explain and how (seed 002 Ch. 3)."""

    methods: list[Method] = Field(default_factory=lambda: ["saliency", "integrated_gradients", "smoothgrad",
                                                           "gradient_x_input"])
    layer: str | None = None  # the slice for internal units; default: the input of the last linear layer's module
    n_inputs: int = Field(8, ge=1, le=64)  # test inputs shown in the attribution grids
    classes: list[int] | None = None  # classes for the top-units table (default: all)
    top_k: int = Field(4, ge=1, le=32)
    per_class_points: int = Field(32, ge=1)  # DoI of the top-units ranking: test points of the class
    steps: int = Field(64, ge=2)  # integrated-gradients path
    smoothgrad_std: float = Field(0.15, ge=0.0)
    smoothgrad_samples: int = Field(32, ge=1)
    visualize: list[str] = Field(default_factory=lambda: ["attribution", "inversion"])
    inversion_steps: int = Field(128, ge=1)
    inversion_step_size: float = Field(0.05, gt=0.0)
    batch_size: int | None = Field(4096, ge=1)

    @model_validator(mode="after")
    def _check(self) -> ExplainSettings:
        bad = [v for v in self.visualize if v not in ("attribution", "inversion")]
        if bad:
            raise ValueError(f"visualize: {bad} not valid; valid choices: 'attribution', 'inversion'")
        if not self.methods:
            raise ValueError(f"methods: give at least one of {', '.join(METHODS)}")
        return self


class ExplainConfig(StrictModel):
    data: DataConfig = DataConfig()
    models: list[ModelEntry]
    explain: ExplainSettings = ExplainSettings()
    seed: int = 0
    device: DeviceSetting = "cpu"

    @model_validator(mode="after")
    def _names(self) -> ExplainConfig:
        names = [m.name for m in self.models]
        if not names:
            raise ValueError("models: give at least one [[models]] entry")
        if len(set(names)) != len(names):
            raise ValueError(f"models: names must be unique, got {names}")
        return self


# ------------------------------------------------------------------------------------------------------------
def load_checkpoint(path: str | Path) -> tuple[nn.Module, dict[str, Any]]:
    """A model from a ``modelward train`` or ``modelward robust train`` checkpoint (safetensors; the architecture
    comes from its metadata, read by :func:`modelward.core.checkpoint.load_checkpoint`). GloRo/robust checkpoints
    give their logit model ``f``."""
    ck = core_load_checkpoint(path)
    return ck.model, ck.meta


def default_layer(model: nn.Module, x: torch.Tensor) -> str:
    """The layer whose output the classifier reads, by the data flow of a forward pass on `x`
    (:func:`modelward.explain.layers.feature_layer`): ``fc1`` for the zoo's CNN and MLP, ``gap`` (the pooled
    features) for its ResNet, ``"<classifier>:in"`` where no module outputs those features as they are."""
    return feature_layer(model, x)


def _model_for(entry: ModelEntry, out: Path, data: DataSplit, base: Path) -> nn.Module:
    if entry.path is not None:
        p = Path(entry.path)
        model, meta = load_checkpoint(p if p.is_absolute() else base / p)
        shape = tuple(meta.get("input_shape", data.input_shape))
        if shape != tuple(data.input_shape):
            raise ConfigError(f"model {entry.name!r}: trained on inputs {shape}, data has {data.input_shape}; use the "
                              "[data] the model was trained with")
        return model
    model, _ = load_checkpoint(out / "models" / f"{entry.name}.safetensors")
    return model


def train_entry(entry: ModelEntry, data_cfg: DataConfig, out: Path) -> dict[str, Any]:
    """Train a zoo model for an entry without a checkpoint and save it as OUT/models/<name>.safetensors."""
    assert entry.model is not None
    model, result, data = fit_from_config(data_cfg, entry.model, entry.train, entry.seed)
    meta = {"kind": "zoo", "model": entry.model.model_dump(mode="json"), "data": data_cfg.model_dump(mode="json"),
            "input_shape": list(data.input_shape), "num_classes": data.num_classes, "seed": entry.seed}
    save_state_dict(out / "models" / f"{entry.name}.safetensors", model.state_dict(), meta)
    return {"test_error": result.curve[-1][1], "steps": result.steps_run}


def _points(cfg: ExplainConfig, data: DataSplit) -> tuple[torch.Tensor, torch.Tensor]:
    n = min(cfg.explain.n_inputs, len(data.x_test))
    return data.x_test[:n], data.y_test[:n]


def explain_model(cfg: ExplainConfig, entry: ModelEntry, out: Path, base: Path) -> dict[str, Any]:
    """Input attributions (each method) of the true class for the first test inputs: table + grid."""
    from modelward.explain.plots import attribution_grid  # matplotlib on first figure only

    data = load_data(cfg.data)
    dev = resolve_device(cfg.device)
    model = _model_for(entry, out, data, base).to(dev)
    x, y = _points(cfg, data)
    s = cfg.explain
    qoi = ClassQoI(tuple(int(v) for v in y.tolist()))
    maps: dict[str, torch.Tensor] = {}
    rows = []
    with torch.no_grad():
        pred = model(x.to(dev)).argmax(1).cpu()
    for method in s.methods:
        a = attribute(model, x, qoi, method, steps=s.steps, std=s.smoothgrad_std, samples=s.smoothgrad_samples,
                      seed=cfg.seed, batch_size=s.batch_size).cpu()
        maps[method] = a
        conc = concentration(a)
        for i in range(len(x)):
            rows.append({"model": entry.name, "method": method, "input": i, "label": int(y[i]), "pred": int(pred[i]),
                         "sum": float(a[i].sum()), "abs_sum": float(a[i].abs().sum()),
                         "top10_share": float(conc[i])})
    folder = out / entry.name
    folder.mkdir(parents=True, exist_ok=True)
    write_table(folder, "attributions", rows, title=f"{entry.name}: input attributions of the true class",
                notes=["sum = Σ attribution (≈ logit(x) − logit(0) for integrated gradients, Eq. 3.3);",
                       "top10_share = share of |attribution| on the 10% most attributed input features."])

    save_tensors(folder / "attributions.safetensors", {k: v.contiguous() for k, v in maps.items()} | {"x": x})
    attribution_grid(folder / "attributions.png", x, maps, [f"y={int(a)} ŷ={int(b)}" for a, b in zip(y, pred, strict=True)],
                     f"{entry.name}: input attributions of the true class")
    return {"model": entry.name, "inputs": len(x), "accuracy_shown": float((pred == y).float().mean())}


def units_model(cfg: ExplainConfig, entry: ModelEntry, out: Path, base: Path) -> dict[str, Any]:
    """Top internal units of the slice per class (§3.3), visualised by input attribution and/or inversion."""
    from modelward.explain.plots import unit_grid  # matplotlib on first figure only

    data = load_data(cfg.data)
    model = _model_for(entry, out, data, base).to(resolve_device(cfg.device))
    s = cfg.explain
    layer = s.layer or default_layer(model, data.x_test[:2].to(resolve_device(cfg.device)))
    classes = s.classes if s.classes is not None else list(range(data.num_classes))
    bad = [c for c in classes if not 0 <= c < data.num_classes]
    if bad:
        raise ConfigError(f"explain.classes: {bad} out of range 0..{data.num_classes - 1}")
    rows, attr_panels, inv_panels = [], [], []
    for c in classes:
        xc = data.x_test[data.y_test == c][: s.per_class_points]
        if len(xc) == 0:
            continue
        units = top_units(model, layer, xc, c, s.top_k, batch_size=s.batch_size)
        for rank, u in enumerate(units, start=1):
            rows.append({"model": entry.name, "layer": layer, "class": c, "rank": rank, "unit": u.unit,
                         "influence": u.score})
        if "attribution" in s.visualize:
            attr_panels.append([(xc[0], "example", False)] + [
                (unit_attribution(model, layer, u.unit, xc[:1], "integrated_gradients", s.steps, s.batch_size)[0].cpu(),
                 f"unit {u.unit} ({u.score:+.2f})") for u in units])
        if "inversion" in s.visualize:
            inv = unit_inversion(model, layer, [u.unit for u in units], tuple(data.input_shape), s.inversion_steps,
                                 s.inversion_step_size)
            inv_panels.append([(inv[i].cpu(), f"unit {u.unit} ({u.score:+.2f})") for i, u in enumerate(units)])
    folder = out / entry.name
    folder.mkdir(parents=True, exist_ok=True)
    write_table(folder, "top_units", rows, title=f"{entry.name}: most influential units of {layer!r} per class",
                notes=["influence = mean over the class's test points of ∂ logit_class / ∂ unit (channels: summed "
                       "over positions), Def. 3.2 with the point DoI."])
    names = [f"class {c}" for c in classes if (data.y_test == c).any()]
    if attr_panels:
        unit_grid(folder / "top_units_attribution.png", attr_panels, names,
                  f"{entry.name}: top units of {layer} per class (influence) — IG of each unit on an example")
    if inv_panels:
        unit_grid(folder / "top_units_inversion.png", inv_panels, names,
                  f"{entry.name}: top units of {layer} per class — inversion (activation maximisation)", signed=False)
    return {"model": entry.name, "layer": layer, "classes": len(names)}


def compare_all(cfg: ExplainConfig, out: Path, base: Path) -> dict[str, Any]:
    """Pairwise agreement of the models' integrated-gradients attributions on the same inputs, plus a grid."""
    from modelward.explain.plots import attribution_grid  # matplotlib on first figure only

    data = load_data(cfg.data)
    dev = resolve_device(cfg.device)
    models = {e.name: _model_for(e, out, data, base).to(dev) for e in cfg.models}
    x, y = _points(cfg, data)
    attrs, rows = compare_models(models, x, y, "integrated_gradients", cfg.explain.steps, cfg.explain.batch_size)

    qoi = ClassQoI(tuple(int(v) for v in y.tolist()))
    summary = [{"model": n, "ig_top10_share": float(concentration(a).mean()),
                "ig_abs_sum": float(a.flatten(1).abs().sum(1).mean()),
                "saliency_l2": float(saliency(models[n], x, qoi).flatten(1).norm(dim=1).mean())}
               for n, a in attrs.items()]
    write_table(out, "compare_models", summary, title="Per model: how focused and how large the explanations are",
                notes=["ig_top10_share: share of |IG| on the 10% most attributed pixels; saliency_l2: mean ‖∇ logit‖₂ "
                       "of the true class (a GloRo net's is bounded by its Lipschitz constant)."])
    if rows:
        write_table(out, "compare", rows,
                    title="Agreement of integrated-gradients attributions across models (same inputs, true class)",
                    notes=["mean over inputs of the cosine / Spearman rank correlation of the two models' maps."])
    attribution_grid(out / "compare.png", x, attrs, [f"y={int(v)}" for v in y],
                     "integrated gradients of the true class, per model")
    return {"pairs": len(rows), "models": len(summary)}


def plan(cfg: ExplainConfig) -> list[RunSpec]:
    runs = []
    for e in cfg.models:
        deps: tuple[str, ...] = ()
        if e.model is not None:
            runs.append(RunSpec(f"train|{e.name}", {"kind": "train", "name": e.name}))
            deps = (f"train|{e.name}",)
        runs.append(RunSpec(f"attributions|{e.name}", {"kind": "attributions", "name": e.name}, deps))
        runs.append(RunSpec(f"units|{e.name}", {"kind": "units", "name": e.name}, deps))
    runs.append(RunSpec("compare", {"kind": "compare"}, tuple(r.run_id for r in runs if r.spec["kind"] == "attributions")))
    return runs


def execute(run_id: str, spec: dict[str, Any], deps: dict[str, dict[str, Any]], *, config: dict[str, Any],
            out: str, base: str) -> dict[str, Any]:
    """The runner's entry point (bind ``config``/``out``/``base`` with functools.partial)."""
    cfg = ExplainConfig.model_validate(config)
    o, b = Path(out), Path(base)
    kind = spec["kind"]
    if kind == "compare":
        return compare_all(cfg, o, b)
    entry = next(e for e in cfg.models if e.name == spec["name"])
    if kind == "train":
        return train_entry(entry, cfg.data, o)
    if kind == "attributions":
        return explain_model(cfg, entry, o, b)
    if kind == "units":
        return units_model(cfg, entry, o, b)
    raise ConfigError(f"run {run_id}: unknown kind {kind!r}")


def config_json(cfg: ExplainConfig) -> dict[str, Any]:
    return json.loads(json.dumps(cfg.model_dump(mode="json"), sort_keys=True))


@dataclass
class ExplainOutcome:
    """What :func:`run_explain` achieved: each run's recorded ``results`` (run id -> result), and the runner's
    ``done`` / ``total`` / ``failed`` (run id -> error; failed runs restart when the study is run again)."""

    results: dict[str, dict[str, Any]]
    done: int
    total: int
    failed: dict[str, str] = field(default_factory=dict)


class ExplainStudy(Study[ExplainConfig, ExplainOutcome]):
    """The explanation study in the core frame: per model, training (if needed), attributions and top units; then
    the comparison across models.

    Args:
        base: the folder relative checkpoint paths of the config are resolved against.
    """

    name = "explain runs"
    config_model = ExplainConfig

    def __init__(self, base: Path) -> None:
        self.base = base

    def check(self, cfg: ExplainConfig, out: Path) -> None:
        resolve_device(cfg.device)  # an unusable device is refused before any run starts

    def plan(self, cfg: ExplainConfig, ctx: StudyContext) -> list[RunSpec]:
        return plan(cfg)

    def execute(self, cfg: ExplainConfig, ctx: StudyContext) -> Execute:
        return functools.partial(execute, config=config_json(cfg), out=str(ctx.out.resolve()), base=str(self.base))

    def summarize(self, cfg: ExplainConfig, ctx: StudyContext, outcome: RunOutcome) -> ExplainOutcome:
        return ExplainOutcome(ctx.ledger.results(), outcome.done, outcome.total, outcome.failed)


def run_explain(cfg: ExplainConfig, out: str | Path, progress: ProgressSink | None = None, *, workers: int = 1,
                executor: str = "local", address: str | None = None, base: str | Path | None = None
                ) -> ExplainOutcome:
    """Run (or resume) the explanation study in `out`: input attributions of the true class per model
    (``<model>/attributions.*``), the most influential internal units per class (``<model>/top_units.*``) and
    the comparison across models (``compare.*``), by internal influence (seed 002 Ch. 3).

    Args:
        cfg: the study (:class:`ExplainConfig`).
        out: the study folder (``ledger.sqlite``, ``config.json``, ``models/``, the tables); re-running resumes it.
        progress: one unit per run under ``"explain runs"``.
        workers, executor, address: where runs execute (:func:`modelward.core.runner.run_plan`).
        base: the folder relative checkpoint paths are resolved against (default: the current directory).

    Returns:
        :class:`ExplainOutcome`.

    Example:
        >>> from modelward.core.config import load_config
        >>> cfg = load_config("examples/explain_digits.toml", ExplainConfig)  # doctest: +SKIP
        >>> run_explain(cfg, "runs/explain").done  # doctest: +SKIP
    """
    study = ExplainStudy(Path(base) if base is not None else Path.cwd())
    return run_study(study, cfg, out, workers=workers, executor=executor, address=address, progress=progress)
