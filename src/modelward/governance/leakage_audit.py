"""Label-leakage audit: train a model split between Alice and Bob, attack the labels from what Alice receives.

For every protection method and noise scale (``governance.label_protection``), and every seed, the model is
split at ``cut`` with ``governance.plan`` and trained in process exactly as the parties do it: Alice runs her
segment, Bob computes the loss from his labels and the gradient ``dL/dh`` of Alice's activation, perturbs it with
``protect_gradient`` and returns it; each side steps its own optimizer. At every step the norm and direction
attacks (``governance.leakage``) score the labels from the gradient Alice actually received. The result is the
trade-off between test accuracy and label-recovery AUC.

Example:
    >>> cfg = load_audit_config("examples/leakage_breast_cancer.toml")  # doctest: +SKIP
    >>> rows = run_audit(cfg, "runs/leakage")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, field_validator

from modelward.core.config import StrictModel, load_config
from modelward.core.data import DataConfig, DataSplit, load_data
from modelward.core.train import TrainConfig, batch_order, evaluate, make_optimizer
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError
from modelward.governance.label_protection import LabelProtectionConfig, Method, protect_gradient
from modelward.governance.leakage import LeakageMeter
from modelward.governance.plan import make_plan, model_layers, segment_of

COLUMNS = ["method", "scale", "seeds", "test_accuracy", "test_accuracy_sd", "norm_auc", "norm_auc_sd",
           "direction_auc", "direction_auc_sd", "pairwise_auc", "direction_accuracy", "direction_auc_acc",
           "direction_accuracy_acc", "seconds"]


class AuditSettings(StrictModel):
    """``[audit]``: the sweep. ``positive``: binary only, the class the norm attack calls positive ("minority" =
    the rarer training class, as the attacker would guess from the prior)."""

    methods: list[Method] = Field(default_factory=lambda: ["isotropic", "marvell"])
    scales: list[float] = Field(default_factory=lambda: [0.0, 1.0, 4.0, 16.0])
    seeds: list[int] = Field(default_factory=lambda: [0])
    positive: Literal["minority"] | int = "minority"
    init: str = "glorot_uniform"

    @field_validator("scales")
    @classmethod
    def _scales(cls, v: list[float]) -> list[float]:
        if not v or min(v) < 0:
            raise ValueError("give one or more noise scales >= 0, e.g. [0, 1, 4, 16]")
        return v


class LeakageAuditConfig(StrictModel):
    """The TOML file of ``modelward split audit-leakage``: ``[data]``, ``[model]``, ``cut``, ``[train]``,
    ``[audit]``. ``cut`` is the last layer Alice holds (default: the first layer)."""

    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    cut: str | None = None
    train: TrainConfig = Field(default_factory=lambda: TrainConfig(steps=300))
    audit: AuditSettings = Field(default_factory=AuditSettings)


def load_audit_config(path: str | Path, overrides: list[str] | None = None) -> LeakageAuditConfig:
    return load_config(path, LeakageAuditConfig, overrides)


def simulate_split(data: DataSplit, model_cfg: ModelConfig, cut: str | None, train_cfg: TrainConfig,
                   protection: LabelProtectionConfig, seed: int, positive: int = 1,
                   init: str = "glorot_uniform") -> dict[str, float]:
    """Train Alice | Bob in process with Bob's protection; return test accuracy and the attacks' mean AUCs.

    Args:
        data: the data set (Alice's inputs, Bob's labels).
        model_cfg: a zoo model.
        cut: the last layer Alice holds (None = the first layer).
        train_cfg: the training procedure (both parties use it for their own optimizer).
        protection: Bob's ``[label_protection]``.
        seed: model init, batch order, protection noise and the attacker's choice of reference examples.
        positive: binary only: the class the attacker calls positive.
        init: initialisation scheme.
    Returns:
        ``test_accuracy``, ``norm_auc``, ``direction_auc``, ``pairwise_auc`` (means over steps), and
        ``direction_accuracy`` for more than two classes.
    """
    from modelward.core.init import init_model_

    model = init_model_(build_model(model_cfg, data.input_shape, data.num_classes), init, seed)
    names = [lay.name for lay in model_layers(model)]
    cut = cut or names[0]
    plan = make_plan(model, ["alice", "bob"], [cut])
    alice = segment_of(model, plan.owners["alice"], "alice")
    bob = segment_of(model, plan.owners["bob"], "bob")
    opt_a = make_optimizer(list(alice.parameters()), train_cfg)
    opt_b = make_optimizer(list(bob.parameters()), train_cfg)
    noise = torch.Generator().manual_seed(seed + 7919)
    meter = LeakageMeter(data.num_classes, positive, seed)
    batches = batch_order(len(data.x_train), train_cfg.batch_size, seed)
    model.train()
    for step in range(train_cfg.steps):
        idx = next(batches)
        for opt in (opt_a, opt_b):
            for group in opt.param_groups:
                group["lr"] = train_cfg.lr_at(step)
        h = alice(data.x_train[idx])                       # Alice's forward
        h_bob = h.detach().requires_grad_(True)            # what crosses the cut
        y = data.y_train[idx]                              # only Bob has these
        loss = F.cross_entropy(bob(h_bob), y)
        opt_b.zero_grad(set_to_none=True)
        loss.backward()
        sent = protect_gradient(h_bob.grad, y, protection, generator=noise)
        opt_b.step()
        meter.update(sent, y, step, idx)                   # Alice's view: the gradient she received
        opt_a.zero_grad(set_to_none=True)
        h.backward(sent)
        opt_a.step()
    err = evaluate(model, data.x_test, data.y_test, "error", train_cfg.eval_batch_size)
    return {"test_accuracy": 1.0 - err, **meter.summary()}


def _positive(data: DataSplit, spec: Literal["minority"] | int) -> int:
    if spec == "minority":
        return int(torch.bincount(data.y_train, minlength=data.num_classes).argmin())
    if not 0 <= int(spec) < data.num_classes:
        raise ConfigError(f"audit.positive={spec}: valid are 'minority' or a class index 0..{data.num_classes - 1}")
    return int(spec)


def _mean_sd(vals: list[float]) -> tuple[float, float]:
    a = np.array(vals, dtype=np.float64)
    a = a[~np.isnan(a)]
    if not len(a):
        return float("nan"), float("nan")
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else float("nan")


def run_audit(cfg: LeakageAuditConfig, out_dir: str | Path,
              on_run: Callable[[str, dict], None] | None = None) -> list[dict]:
    """Run the sweep (methods × scales × seeds; scale 0 once, as "none"); write results and the trade-off plot.

    Returns:
        One row per (method, scale) with means (and SDs over seeds) of accuracy and attack AUCs.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = load_data(cfg.data)
    positive = _positive(data, cfg.audit.positive)
    settings: list[tuple[str, float]] = []
    if 0.0 in cfg.audit.scales or not cfg.audit.methods:
        settings.append(("none", 0.0))
    settings += [(m, s) for m in cfg.audit.methods if m != "none" for s in cfg.audit.scales if s > 0]
    rows, runs = [], []
    for method, scale in settings:
        per_seed = []
        t0 = time.perf_counter()
        for seed in cfg.audit.seeds:
            res = simulate_split(data, cfg.model, cfg.cut, cfg.train,
                                 LabelProtectionConfig(method=method, scale=scale), seed, positive, cfg.audit.init)
            res = {"method": method, "scale": scale, "seed": seed, **res}
            per_seed.append(res)
            runs.append(res)
            if on_run:
                on_run(f"{method} scale={scale:g} seed={seed}", res)
        row: dict = {"method": method, "scale": scale, "seeds": len(per_seed)}
        for key in ("test_accuracy", "norm_auc", "direction_auc", "pairwise_auc", "direction_accuracy",
                    "direction_auc_acc", "direction_accuracy_acc"):
            mean, sd = _mean_sd([r.get(key, float("nan")) for r in per_seed])
            row[key] = mean
            if key in ("test_accuracy", "norm_auc", "direction_auc"):
                row[f"{key}_sd"] = sd
        row["seconds"] = time.perf_counter() - t0
        rows.append(row)
    binary = data.num_classes == 2
    notes = [
        f"data {data.describe()}; model {cfg.model.arch}, Alice holds up to layer "
        f"{cfg.cut or model_layers(build_model(cfg.model, data.input_shape, data.num_classes))[0].name}; "
        f"{cfg.train.steps} steps of batch {cfg.train.batch_size}; seeds {cfg.audit.seeds}.",
        "AUCs are per training batch, averaged over all steps, from the gradient Alice received (0.5 = chance).",
        (f"binary: positive = class {positive} ({data.class_names[positive]}); norm attack = ||g||, direction attack"
         " = cosine with one known positive example of the batch (Li et al. 2022)." if binary else
         "multiclass: norm_auc and direction_auc are macro means of one-vs-rest AUCs over the classes; the "
         "direction attack knows one example of each class per batch; direction_accuracy = labels recovered by the "
         "most similar known example; pairwise_auc needs no label."),
        "scale: noise power as a multiple of the squared distance between the batch's class-mean gradients.",
    ]
    write_results(out, rows, runs, notes)
    tradeoff_plot(out / "tradeoff.png", rows, f"label leakage vs accuracy: {data.name}")
    return rows


def write_results(out: Path, rows: list[dict], runs: list[dict], notes: list[str]) -> dict[str, Path]:
    """results.csv / results.md / results.json (+ runs.json with every seed)."""
    try:
        from modelward.core.records import atomic_write_json, write_table
    except ImportError:  # pragma: no cover - before core.records landed
        write_table = None
    if write_table is not None:
        paths = write_table(out, "results", rows, COLUMNS, title="Label leakage audit", notes=notes)
        atomic_write_json(out / "runs.json", runs)
        return paths
    import csv

    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)

    def fmt(v: object) -> str:
        return f"{v:.4f}" if isinstance(v, float) else str(v)

    md = ["# Label leakage audit", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    md += ["| " + " | ".join(fmt(r.get(c, "")) for c in COLUMNS) + " |" for r in rows]
    md += ["", *[f"- {n}" for n in notes], ""]
    (out / "results.md").write_text("\n".join(md))
    (out / "results.json").write_text(json.dumps({"rows": rows, "notes": notes}, indent=2))
    (out / "runs.json").write_text(json.dumps(runs, indent=2))
    return {"csv": out / "results.csv", "md": out / "results.md", "json": out / "results.json"}


def tradeoff_plot(path: Path, rows: list[dict], title: str) -> Path:
    """Test accuracy against label-recovery AUC (norm and direction attacks), one curve per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    base = [r for r in rows if r["method"] == "none"]
    for ax, key, name in ((axes[0], "direction_auc", "direction (cosine) attack"), (axes[1], "norm_auc",
                                                                                   "norm attack")):
        for method in dict.fromkeys(r["method"] for r in rows if r["method"] != "none"):
            pts = base + [r for r in rows if r["method"] == method]
            xs, ys = [r[key] for r in pts], [r["test_accuracy"] for r in pts]
            ax.plot(xs, ys, marker="o", label=method)
            for r, x, y in zip(pts, xs, ys, strict=True):
                ax.annotate(f"{r['scale']:g}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
        if base and not any(r["method"] != "none" for r in rows):
            ax.plot([base[0][key]], [base[0]["test_accuracy"]], marker="o", label="none")
        ax.axvline(0.5, color="grey", lw=0.8, ls="--")
        ax.set_xlabel(f"label-recovery AUC, {name}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("test accuracy")
    fig.suptitle(f"{title} (labels: noise scale)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
