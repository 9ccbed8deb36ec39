"""The ``modelward robust`` pipeline: config-driven robust training, GloRo certification and attack evaluation.

One TOML file (:class:`RobustConfig`) names the data, the architecture (App. A.4 notation), the training mode —
``standard`` | ``pgd`` | ``trades`` (adversarial training, :mod:`modelward.robustness.training`) | ``gloro`` |
``rtk`` | ``affinity`` (:mod:`modelward.robustness.gloro`) — and the evaluation (ε list, attacks). Trained models
are safetensors files whose metadata carries the config, so ``certify`` / ``attack`` rebuild the exact
architecture from the file alone.

The three jobs write their own reports into a run directory (the CLI only parses and prints):
:func:`train_experiment` (``model.safetensors``, ``metrics.json``, ``history.{csv,md,json}``),
:func:`certify_experiment` (``certify.{csv,md,json,png}``, ``lipschitz.json``) and :func:`attack_experiment`
(``attack.{csv,md,json,png}``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from modelward.core.checkpoint import Checkpoint, checkpoint_path, read_checkpoint
from modelward.core.config import AlgorithmSpec, StrictModel, validate
from modelward.core.data import DataConfig, DataSplit, load_data
from modelward.core.device import DeviceSetting, resolve_device
from modelward.core.io import (
    load_into,
    load_state_dict,
    optimizer_from_tensors,
    optimizer_to_tensors,
    save_state_dict,
)
from modelward.core.progress import ProgressSink, as_sink
from modelward.core.records import atomic_write_json, write_table
from modelward.core.seed import seeded
from modelward.core.train import TrainConfig
from modelward.errors import ConfigError, DataError
from modelward.robustness.attacks import attack_params, threat_model
from modelward.robustness.attacks.base import predict
from modelward.robustness.bounds import certify_bounds
from modelward.robustness.evaluation import evaluate_points
from modelward.robustness.gloro.certify import certify
from modelward.robustness.gloro.layers import Activation, Init, build_gloro_model
from modelward.robustness.gloro.net import AffinityGloroNet, GloroNet, RtkGloroNet
from modelward.robustness.gloro.train import GloroTrainConfig, train_gloro
from modelward.robustness.metrics import prepare_params, robust_accuracy
from modelward.robustness.training import AdversarialConfig, pgd_adversarial_training, trades_training

Mode = Literal["standard", "pgd", "trades", "gloro", "rtk", "affinity"]
GLORO_MODES = ("gloro", "rtk", "affinity")


class GloroModelConfig(StrictModel):
    arch: str = "2C2F"  # App. A.4 name (2C2F, 4C3F, 6C2F, 8C2F, mlp) or e.g. "c(16,4,2).c(32,4,2).d(100)"
    activation: Activation = "minmax"
    init: Init = "orthogonal"


class RobustTrainConfig(GloroTrainConfig):
    mode: Mode = "gloro"
    rtk_k: int = Field(2, ge=1)  # mode = rtk
    # rtk / affinity ⊥ logit: "full" = gradient through max f (reference library, trains); "stop" = the thesis'
    # footnote stop_gradient(max f) − m(x), which does not train (kept for comparison, docs/robustness.md)
    bottom_gradient: Literal["full", "stop"] = "full"
    affinity_sets: list[list[int]] = Field(default_factory=list)  # mode = affinity
    adversarial: AdversarialConfig = Field(default_factory=lambda: AdversarialConfig(eps=0.3, norm="l2"))
    checkpoint_every: int = Field(10, ge=1)  # epochs (gloro/standard modes resume from the last checkpoint)

    @model_validator(mode="after")
    def _mode_needs(self) -> RobustTrainConfig:
        if self.mode == "affinity" and not self.affinity_sets:
            raise ValueError("train.mode='affinity' needs train.affinity_sets, e.g. [[0], [1, 7], [3, 5, 8]]")
        return self


class RobustEvalConfig(StrictModel):
    """The ``[evaluate]`` table: attacks (``[[evaluate.attacks]]``, empty params = the attack's own defaults, norm =
    ``evaluate.norm``) swept over ``epsilons``."""

    epsilons: list[float] = Field(default_factory=lambda: [0.1, 0.3, 0.5])
    norm: Literal["l2", "linf"] = "l2"  # the sweep's threat model (GloRo certifies ℓ2); every attack must match it
    attacks: list[AlgorithmSpec] = Field(default_factory=lambda: [AlgorithmSpec(name="pgd", params={"steps": 40})])
    max_points: int | None = Field(None, ge=1)  # evaluate on the first N test points only
    batch_size: int = Field(1024, ge=1)

    @model_validator(mode="after")
    def _eps(self) -> RobustEvalConfig:
        if not self.epsilons or min(self.epsilons) < 0:
            raise ValueError("evaluate.epsilons must be a non-empty list of radii >= 0")
        return self


class RobustConfig(StrictModel):
    """The ``modelward robust`` configuration (see examples/robust_gloro.toml).

    Args:
        seed: seeds data, model and training.
        data: the data source (``[data]``).
        model: the GloRo architecture (``[model]``).
        train: the training mode and schedule (``[train]``: gloro / rtk / affinity / standard / pgd / trades).
        evaluate: the attack sweep (``[evaluate]``).

    Example:
        >>> RobustConfig().train.mode
        'gloro'
    """

    seed: int = 0
    # where training, certification and attacks run (docs/devices.md); not part of the run's identity: a run
    # may resume on another device
    device: DeviceSetting = "cpu"
    data: DataConfig = Field(default_factory=DataConfig)
    model: GloroModelConfig = Field(default_factory=GloroModelConfig)
    train: RobustTrainConfig = Field(default_factory=RobustTrainConfig)
    evaluate: RobustEvalConfig = Field(default_factory=RobustEvalConfig)


def build_net(model: nn.Sequential, input_shape: tuple[int, ...], train: RobustTrainConfig, epsilon: float,
              seed: int = 0) -> GloroNet:
    """The GloRo wrapper for the training mode (rtk / affinity relaxations, plain GloRo otherwise)."""
    kw = {"num_iterations": train.power_iterations, "seed": seed}
    if train.mode == "rtk":
        return RtkGloroNet(model, input_shape, epsilon, train.rtk_k, bottom_gradient=train.bottom_gradient, **kw)
    if train.mode == "affinity":
        return AffinityGloroNet(model, input_shape, epsilon, train.affinity_sets,
                                bottom_gradient=train.bottom_gradient, **kw)
    return GloroNet(model, input_shape, epsilon, **kw)


@dataclass
class TrainOutcome:
    model: nn.Sequential
    net: GloroNet
    history: list[dict[str, float]]
    seconds: float


def train_robust(cfg: RobustConfig, data: DataSplit, out: Path, progress: ProgressSink | None = None) -> TrainOutcome:
    """Train per ``cfg.train.mode``; checkpoints to ``out/checkpoint.safetensors`` and resumes from it.

    Epochs are reported to `progress` under the key ``"train"``.
    """
    with seeded(cfg.seed):  # the layers' default initialisation and dropout draw from the global RNG
        return _train_robust(cfg, data, Path(out), as_sink(progress))


def _train_robust(cfg: RobustConfig, data: DataSplit, out: Path, sink: ProgressSink) -> TrainOutcome:
    t = cfg.train
    sink.start("train", t.epochs, f"train ({t.mode})")
    shown = [0]

    def on_progress(done: int, total: int, info: str) -> None:
        sink.advance("train", done - shown[0], info)
        shown[0] = done

    model = build_gloro_model(cfg.model.arch, data.input_shape, data.num_classes, cfg.model.activation,
                              cfg.model.init, cfg.seed).to(resolve_device(cfg.device))  # initialised on the CPU
    t = cfg.train
    net = build_net(model, data.input_shape, t, t.epsilon, cfg.seed)
    history: list[dict[str, float]] = []
    if t.mode in ("pgd", "trades"):
        per_epoch = max(1, len(data.x_train) // t.batch_size)
        steps = t.epochs * per_epoch
        tc = TrainConfig(optimizer="adam", lr=t.lr, weight_decay=0.0, batch_size=t.batch_size, steps=steps,
                         eval_every=per_epoch, amp=t.amp)
        fn = pgd_adversarial_training if t.mode == "pgd" else trades_training

        def on_step(step: int, loss: float) -> None:
            if step % per_epoch == 0:
                on_progress(step // per_epoch, t.epochs, f"loss {loss:.3f}")

        res = fn(model, data.x_train, data.y_train, tc, t.adversarial, seed=cfg.seed, on_step=on_step)
        history = [{"epoch": s / per_epoch, "loss": v} for s, v in res.train_loss]
        sink.done("train")
        return TrainOutcome(model, net, history, res.seconds)

    gcfg = GloroTrainConfig(**{k: getattr(t, k) for k in GloroTrainConfig.model_fields})
    if t.mode == "standard":
        gcfg.loss = "standard"
    ckpt = out / "checkpoint.safetensors"
    opt = torch.optim.Adam(model.parameters(), lr=t.lr, eps=1e-7)
    start = 0
    fingerprint = json.dumps(cfg.model_dump(mode="json", exclude={"device"}), sort_keys=True)
    if ckpt.is_file():
        tensors, meta = load_state_dict(ckpt)
        if meta.get("config") == fingerprint:
            load_into(net, {k[4:]: v for k, v in tensors.items() if k.startswith("net.")}, ckpt)
            optimizer_from_tensors(opt, {k: v for k, v in tensors.items() if k.startswith("opt.")},
                                   meta["optimizer"])
            start, history = int(meta["epoch"]), list(meta["history"])

    def on_epoch(row: dict[str, float]) -> None:
        history.append(row)
        e = int(row["epoch"])
        if e % t.checkpoint_every == 0 or e == t.epochs:
            otensors, skel = optimizer_to_tensors(opt)
            tensors = {f"net.{k}": v for k, v in net.state_dict().items()} | otensors
            save_state_dict(ckpt, tensors, {"config": fingerprint, "optimizer": skel, "epoch": e, "history": history})
        on_progress(e, t.epochs, f"loss {row['loss']:.3f} ε {row['epsilon']:.3f}")

    res = train_gloro(net, data.x_train, data.y_train, gcfg, cfg.seed, on_epoch, start_epoch=start, optimizer=opt)
    net.epsilon = t.epsilon
    sink.done("train")
    return TrainOutcome(model, net, history, res.seconds)


def save_model(path: Path, outcome: TrainOutcome, cfg: RobustConfig, input_shape: tuple[int, ...],
               num_classes: int) -> None:
    """Weights of the underlying model + power iterates; the metadata carries what is needed to rebuild it."""
    tensors = {f"f.{k}": v for k, v in outcome.model.state_dict().items()}
    tensors |= {f"iterates.{k}": v for k, v in outcome.net.sub.state_dict().items()}
    save_state_dict(path, tensors, {"kind": "gloro", "config": cfg.model_dump(mode="json", exclude={"device"}),
                                    "input_shape": list(input_shape), "num_classes": num_classes})


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[GloroNet, RobustConfig]:
    """Rebuild a trained model (as a GloRo net of its training mode) from a file or run directory, on
    `device` (read by :func:`modelward.core.checkpoint.load_checkpoint`, kind ``"gloro"``)."""
    p = checkpoint_path(path)
    tensors, meta = read_checkpoint(p)
    if "config" not in meta:
        raise DataError(f"{p}: not a 'modelward robust train' model (no config in its metadata)")
    ck = load_gloro_checkpoint(p, tensors, meta, resolve_device(device))
    assert isinstance(ck.wrapper, GloroNet)
    return ck.wrapper, ck.config


def load_gloro_checkpoint(p: Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any],
                          device: torch.device) -> Checkpoint:
    """The ``"gloro"`` checkpoint kind (:data:`modelward.core.checkpoint.CHECKPOINT_KINDS`): the embedded
    config rebuilds the architecture and the GloRo net; ``f.*`` are the model's weights, ``iterates.*`` the power
    iterates. The checkpoint's model is the logit model ``f``; its wrapper is the GloRo net (eval mode)."""
    if "config" not in meta:
        raise DataError(f"{p}: not a 'modelward robust train' model (no config in its metadata)")
    cfg = validate(RobustConfig, meta["config"], f"{p} (embedded config)")
    shape, m = tuple(meta["input_shape"]), int(meta["num_classes"])
    model = build_gloro_model(cfg.model.arch, shape, m, cfg.model.activation, cfg.model.init, cfg.seed)
    net = build_net(model, shape, cfg.train, cfg.train.epsilon, cfg.seed)
    load_into(model, {k[2:]: v for k, v in tensors.items() if k.startswith("f.")}, f"{p} (f.*, its embedded config)")
    load_into(net.sub, {k[9:]: v for k, v in tensors.items() if k.startswith("iterates.")}, f"{p} (iterates.*)")
    net.to(device)
    net.eval()
    return Checkpoint("gloro", net.f, meta, p, cfg, net)


def eval_points(cfg: RobustConfig, data: DataSplit) -> tuple[torch.Tensor, torch.Tensor]:
    n = cfg.evaluate.max_points or len(data.x_test)
    return data.x_test[:n], data.y_test[:n]


def check_shapes(net: GloroNet, data: DataSplit) -> None:
    if tuple(net.input_shape) != tuple(data.input_shape) or net.num_classes != data.num_classes:
        raise ConfigError(f"data: {data.describe()} does not match the model (input {net.input_shape}, "
                          f"{net.num_classes} classes); use the [data] section the model was trained with")


def certify_table(net: GloroNet, x: torch.Tensor, y: torch.Tensor, epsilons: list[float],
                  batch_size: int = 1024) -> tuple[list[dict[str, float]], dict]:
    """Clean accuracy, VRA and rejection rate per ε (the bound is frozen once for all ε)."""
    report = net.freeze()
    rows = [certify(net, x, y, eps, batch_size).to_dict() for eps in epsilons]
    return rows, report.to_dict()


def check_attacks(attacks: list[AlgorithmSpec], norm: str) -> list[dict[str, Any]]:
    """Validate every attack before any runs (names, parameters, threat model against the sweep's ``norm``);
    returns each one's parameters for the sweep. ConfigError names the attack (``evaluate.attacks[i]``)."""
    out = []
    for i, spec in enumerate(attacks):
        try:
            params, _ = prepare_params(spec.name, spec.params, norm)
            bad = sorted(set(params) - set(attack_params(spec.name)) - {"seed"})
            if bad:
                raise ConfigError(f"unknown parameter(s) {bad}; valid: {', '.join(attack_params(spec.name))}")
        except ConfigError as e:
            raise ConfigError(f"evaluate.attacks[{i}] ({spec.name}): {e}") from None
        out.append(params)
    return out


def attack_table(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epsilons: list[float],
                 attacks: list[AlgorithmSpec], seed: int = 0,
                 progress: ProgressSink | None = None, norm: str = "l2") -> list[dict[str, Any]]:
    """Robust accuracy per attack and ε in one threat model (``norm``; part A's
    :func:`modelward.robustness.metrics.robust_accuracy`). Every attack is checked before the first one runs;
    minimum-norm ℓ2 attacks (C&W, L-BFGS) count a point as broken at ε when ‖δ‖₂ ≤ ε (``threat`` column).
    One progress unit per (attack, ε) under the key ``"attacks"``."""
    checked = check_attacks(attacks, norm)
    sink = as_sink(progress)
    sink.start("attacks", len(epsilons) * len(attacks), "attacks")
    rows: list[dict[str, Any]] = []
    for spec, params in zip(attacks, checked, strict=True):
        params = dict(params)
        params.setdefault("seed", seed)
        tm = threat_model(spec.name, params)
        threat = f"{norm} ball" if tm.takes_eps else f"{norm} min-norm, ‖δ‖ ≤ ε"
        pts = robust_accuracy(model, x, y, spec.name, epsilons, params, norm=norm)
        for pt in pts:
            rows.append({"attack": spec.key, "threat": threat, **pt.as_dict()})
            sink.advance("attacks", 1, f"{spec.key} ε={pt.eps}")
    sink.done("attacks")
    return rows


# -- the three jobs, each writing its report --------------------------------------------------------------------
def train_experiment(cfg: RobustConfig, out: str | Path, progress: ProgressSink | None = None,
                     data: DataSplit | None = None) -> dict[str, Any]:
    """Train (resuming from ``out/checkpoint.safetensors``), save ``out/model.safetensors`` and write
    ``metrics.json`` (clean accuracy and VRA at ε_train, Lipschitz constants, seconds) and ``history.*``.

    Returns the metrics dict.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = data or load_data(cfg.data)
    outcome = train_robust(cfg, data, out, progress)
    save_model(out / "model.safetensors", outcome, cfg, data.input_shape, data.num_classes)
    rows, bound = certify_table(outcome.net, data.x_test, data.y_test, [cfg.train.epsilon])
    metrics = {"mode": cfg.train.mode, "seconds": outcome.seconds, "epsilon": cfg.train.epsilon, **rows[0],
               "lipschitz_sub": bound["lipschitz_sub"], "max_margin_lipschitz": bound["max_margin_lipschitz"]}
    atomic_write_json(out / "metrics.json", metrics)
    if outcome.history:
        write_table(out, "history", outcome.history, title="training history")
    return metrics


def certify_experiment(cfg: RobustConfig, net: GloroNet, x: torch.Tensor, y: torch.Tensor, out: str | Path,
                       attacks: bool = True, progress: ProgressSink | None = None) -> list[dict[str, Any]]:
    """Clean accuracy, VRA and rejection per ε (plus robust accuracy under ``cfg.evaluate.attacks`` when
    `attacks`); writes ``certify.{csv,md,json,png}`` and ``lipschitz.json``. Returns the rows."""
    from modelward.core.plots import line_plot  # matplotlib on first figure only

    out = Path(out)
    eps = cfg.evaluate.epsilons
    rows, bound = certify_table(net, x, y, eps, cfg.evaluate.batch_size)
    if attacks and cfg.evaluate.attacks:
        arows = attack_table(net.f, x, y, eps, cfg.evaluate.attacks, cfg.seed, progress, norm=cfg.evaluate.norm)
        for r in rows:
            for a in arows:
                if a["eps"] == r["epsilon"]:
                    r[f"robust_accuracy_{a['attack']}"] = a["robust_accuracy"]
    write_table(out, "certify", rows, title=f"GloRo certification ({len(y)} test points)")
    atomic_write_json(out / "lipschitz.json", bound)
    series = {"VRA (certified)": (eps, [r["vra"] for r in rows]),
              "clean accuracy": (eps, [r["clean_accuracy"] for r in rows])}
    for key in rows[0]:
        if key.startswith("robust_accuracy_"):
            series[key.replace("robust_accuracy_", "robust acc. ")] = (eps, [r[key] for r in rows])
    line_plot(out / "certify.png", series, "Certified (VRA) and empirical robustness",
              f"ε ({cfg.evaluate.norm})", "accuracy")
    return rows


def attack_experiment(cfg: RobustConfig, net: GloroNet, x: torch.Tensor, y: torch.Tensor, out: str | Path,
                      progress: ProgressSink | None = None) -> list[dict[str, Any]]:
    """Robust accuracy per ε for each attack of ``cfg.evaluate.attacks``; writes ``attack.{csv,md,json,png}``.
    Returns the rows."""
    from modelward.core.plots import line_plot  # matplotlib on first figure only

    out = Path(out)
    eps = cfg.evaluate.epsilons
    rows = attack_table(net.f, x, y, eps, cfg.evaluate.attacks, cfg.seed, progress, norm=cfg.evaluate.norm)
    write_table(out, "attack", rows, title=f"Robust accuracy ({len(y)} test points)")
    series = {a.name: (eps, [r["robust_accuracy"] for r in rows if r["attack"] == a.name])
              for a in cfg.evaluate.attacks}
    line_plot(out / "attack.png", series, "Robust accuracy vs ε", f"ε ({cfg.evaluate.norm})", "robust accuracy")
    return rows


# -- AutoAttack and the other certificates (issue 28) ------------------------------------------------------------
CERTIFY_METHODS = ("gloro", "smoothing", "ibp", "crown")


def autoattack_experiment(cfg: RobustConfig, net: GloroNet, x: torch.Tensor, y: torch.Tensor, out: str | Path,
                          attack_params: dict[str, Any] | None = None,
                          progress: ProgressSink | None = None) -> dict[str, Any]:
    """AutoAttack (standard) at every ε of ``cfg.evaluate`` in its norm, with every applicable certificate: one
    status per point, the sandwich and the gradient-masking flags. Writes ``attack.{csv,md,json,png}`` (the
    AutoAttack robust accuracy per ε), ``sandwich.{csv,md,json}`` (the rows) and ``points.json`` (the status of
    every point at every ε). Returns :meth:`RobustnessEvaluation.to_dict` with the points."""
    # lazy: matplotlib on first figure only (cli.robust imports this module for `modelward robust --help`)
    from modelward.core.plots import line_plot

    out = Path(out)
    eps = cfg.evaluate.epsilons
    sink = as_sink(progress)
    sink.start("autoattack", len(eps), "AutoAttack + certificates")
    ev = evaluate_points(net, x, y, eps, cfg.evaluate.norm, "auto", cfg.seed, attack_params)
    sink.advance("autoattack", len(eps), "done")
    sink.done("autoattack")
    data = ev.to_dict(include_points=True)
    rows = [{"attack": "autoattack", "threat": f"{cfg.evaluate.norm} ball", "eps": r["eps"],
             "clean_accuracy": data["clean_accuracy"], "robust_accuracy": r["attacked_upper"], "n": data["n"],
             **{f"broken_by_{k}": v for k, v in r["broken_by"].items()}} for r in data["rows"]]
    write_table(out, "attack", rows, title=f"AutoAttack (standard) robust accuracy ({len(y)} test points)")
    sand = [{"eps": r["eps"], "certified_lower": r["certified_lower"], "attacked_upper": r["attacked_upper"],
             "gap": r["gap"], "unresolved": r["unresolved"],
             "certified_by": ", ".join(f"{k} {v}" for k, v in r["certified_by"].items()) or "-",
             "broken_by": ", ".join(f"{k} {v}" for k, v in r["broken_by"].items()) or "-"} for r in data["rows"]]
    notes = [f"certificates: {', '.join(data['certificates']) or 'none'}"]
    notes += [f"skipped {k}: {v}" for k, v in data["skipped_certificates"].items()]
    notes += [f"{'NOTE' if d.get('info') else 'FLAG'} {d['flag']} (ε={d['eps']}): {d['detail']}"
              for d in data["diagnostics"]]
    write_table(out, "sandwich", sand, title=f"Robust accuracy sandwich ({cfg.evaluate.norm}, {len(y)} points)",
                notes=notes)
    atomic_write_json(out / "points.json", data)
    line_plot(out / "attack.png", {"AutoAttack (upper bound)": (eps, [r["attacked_upper"] for r in data["rows"]]),
                                   "certified (lower bound)": (eps, [r["certified_lower"] for r in data["rows"]])},
              "Robust accuracy sandwich", f"ε ({cfg.evaluate.norm})", "accuracy")
    return data


def bound_certify_experiment(cfg: RobustConfig, net: GloroNet, x: torch.Tensor, y: torch.Tensor, out: str | Path,
                             method: str) -> list[dict[str, Any]]:
    """IBP or CROWN certified accuracy of the underlying model per ε (``cfg.evaluate``'s norm); writes
    ``certify.{csv,md,json,png}``. Refuses (naming them) layers the bound propagation does not support."""
    # lazy: matplotlib on first figure only (cli.robust imports this module for `modelward robust --help`)
    from modelward.core.plots import line_plot

    if method not in ("ibp", "crown"):
        raise ConfigError(f"method must be one of {', '.join(CERTIFY_METHODS)}, got {method!r}")
    out = Path(out)
    rows = []

    clean = float((predict(net.f, x) == y).float().mean())
    for e in cfg.evaluate.epsilons:
        c = certify_bounds(net.f, x, y, e, cfg.evaluate.norm, method)  # type: ignore[arg-type]
        rows.append({"method": method, "norm": cfg.evaluate.norm, "epsilon": e, "clean_accuracy": clean,
                     "certified_accuracy": c.certified_accuracy})
    write_table(out, "certify", rows, title=f"{method.upper()} certification ({len(y)} test points)")
    eps = cfg.evaluate.epsilons
    line_plot(out / "certify.png", {f"{method.upper()} certified": (eps, [r["certified_accuracy"] for r in rows]),
                                    "clean accuracy": (eps, [clean] * len(eps))},
              f"{method.upper()} certified accuracy", f"ε ({cfg.evaluate.norm})", "accuracy")
    return rows


def smoothing_certify_experiment(cfg: RobustConfig, net: GloroNet, x: torch.Tensor, y: torch.Tensor,
                                 out: str | Path, sigma: float, n0: int = 100, n: int = 10_000,
                                 alpha: float = 0.001, batch_size: int = 1000) -> list[dict[str, Any]]:
    """Randomized-smoothing certificates (Cohen et al. 2019) of the smoothed underlying model: certified
    accuracy at every ε (ℓ2) and the abstention rate; ``radii.json`` holds every point's class and radius. Writes
    ``certify.{csv,md,json,png}``. The certificate is for the smoothed classifier g, not the model itself."""
    # lazy: matplotlib and scipy on first use only (cli.robust imports this module for `modelward robust --help`)
    from modelward.core.plots import line_plot
    from modelward.robustness.smoothing import SmoothedClassifier  # lazy: scipy, as above

    if cfg.evaluate.norm != "l2":
        raise ConfigError("randomized smoothing certifies ℓ2 radii; set evaluate.norm = \"l2\"")
    out = Path(out)
    g = SmoothedClassifier(net.f, net.num_classes, sigma, batch_size, cfg.seed)
    cert = g.certify(x, y, n0, n, alpha)
    rows = [{"method": "smoothing", "sigma": sigma, "n0": n0, "n": n, "alpha": alpha, "epsilon": e,
             "certified_accuracy": cert.certified_accuracy(e), "abstain_rate": cert.abstain_rate}
            for e in cfg.evaluate.epsilons]
    write_table(out, "certify", rows, title=f"Randomized smoothing, σ = {sigma} ({len(y)} test points)",
                notes=["certifies the smoothed classifier g(x) = argmax P(f(x + δ) = c), δ ~ N(0, σ²I); each "
                       f"certificate holds with probability ≥ 1 − α = {1 - alpha}"])
    atomic_write_json(out / "radii.json", {"predictions": cert.predictions.tolist(), "radii": cert.radii.tolist(),
                                           "labels": cert.labels.tolist(), "sigma": sigma, "alpha": alpha})
    eps = cfg.evaluate.epsilons
    line_plot(out / "certify.png", {"smoothing certified": (eps, [r["certified_accuracy"] for r in rows])},
              f"Randomized smoothing (σ = {sigma})", "ε (l2)", "certified accuracy")
    return rows


__all__ = ["CERTIFY_METHODS", "GloroModelConfig", "RobustConfig", "RobustEvalConfig", "RobustTrainConfig",
           "attack_experiment", "autoattack_experiment", "bound_certify_experiment", "smoothing_certify_experiment",
           "attack_table", "build_net", "certify_experiment", "certify_table", "check_attacks", "check_shapes",
           "eval_points", "load_gloro_checkpoint", "load_model", "save_model", "train_experiment", "train_robust"]
