"""Label-leakage audit: train a model split between Alice and Bob, attack the labels from what Alice receives.

For every protection method and noise scale (``governance.party.label_protection``), and every seed, the model is
split at ``cut`` with ``governance.plan`` and trained in process exactly as the parties do it: Alice runs her
segment, Bob computes the loss from his labels and the gradient ``dL/dh`` of Alice's activation, perturbs it with
``protect_gradient`` and returns it; each side steps its own optimizer. At every step the norm and direction
attacks (``governance.leakage.attacks``) score the labels from the gradient Alice actually received. The result is the
trade-off between test accuracy and label-recovery AUC.

Example:
    >>> cfg = load_audit_config("examples/leakage_breast_cancer.toml")  # doctest: +SKIP
    >>> rows = run_audit(cfg, "runs/leakage")  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, field_validator

from modelward.core.config import StrictModel, load_config
from modelward.core.data import DataConfig, DataSplit, load_data
from modelward.core.init import init_model_
from modelward.core.progress import ProgressSink
from modelward.core.records import atomic_write_json, write_table
from modelward.core.runner import Execute, RunOutcome, RunSpec
from modelward.core.stats import summarize
from modelward.core.study import Study, StudyContext, run_study
from modelward.core.train import TrainConfig, batch_order, evaluate, make_optimizer
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError, ModelwardError
from modelward.governance.leakage.attacks import LeakageMeter
from modelward.governance.leakage.inputs import (
    InputAuditSettings,
    defense_label,
    reconstructions_plot,
    simulate_inputs,
)
from modelward.governance.party.input_protection import InputProtectionConfig
from modelward.governance.party.label_protection import LabelProtectionConfig, Method, protect_gradient
from modelward.governance.party.tensors import CompressionConfig, TensorCompression
from modelward.governance.plan import make_plan, model_layers, segment_of
from modelward.governance.wire import roundtrip

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
    ``[audit]``. ``cut`` is the last layer Alice holds (default: the first layer).

    Args:
        data: the data set (Alice's inputs, Bob's labels).
        model: the zoo model that is split.
        cut: the last layer Alice holds (None: the first layer).
        train: the split training (default 300 steps).
        audit: the sweep (``methods``, noise ``scales``, ``seeds``, the ``positive`` class, ``init``).
        compression: what crosses the cut compressed, as the parties' ``[compression]`` (Alice's activations,
            Bob's gradients after his protection); the attacks score the gradient Alice decodes. Default none.
        inputs: the other direction, Bob reconstructing Alice's inputs (``governance.leakage.inputs``: the
            attacks, Alice's defenses to compare, seeds); off unless the file has an ``[inputs]`` table (or
            ``inputs.attacks`` is set).

    Returns:
        A strict config for :func:`run_audit` (``modelward.governance.run_leakage_audit``).

    Example:
        >>> cfg = LeakageAuditConfig()
        >>> cfg.cut, cfg.train.steps, cfg.audit.methods
        (None, 300, ['isotropic', 'marvell'])
    """

    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    cut: str | None = None
    train: TrainConfig = Field(default_factory=lambda: TrainConfig(steps=300))
    audit: AuditSettings = Field(default_factory=AuditSettings)
    compression: CompressionConfig = Field(default_factory=CompressionConfig)
    inputs: InputAuditSettings = Field(default_factory=lambda: InputAuditSettings(attacks=[]))


def load_audit_config(path: str | Path, overrides: list[str] | None = None) -> LeakageAuditConfig:
    return load_config(path, LeakageAuditConfig, overrides)


def simulate_split(data: DataSplit, model_cfg: ModelConfig, cut: str | None, train_cfg: TrainConfig,
                   protection: LabelProtectionConfig, seed: int, positive: int = 1,
                   init: str = "glorot_uniform", compression: CompressionConfig | None = None
                   ) -> dict[str, float]:
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
        compression: Alice's activations and Bob's gradients compressed as the parties do it (``[compression]``:
            each side uses the decoded tensor, the codec's bytes are those of the wire); None: exact.
    Returns:
        ``test_accuracy``, ``norm_auc``, ``direction_auc``, ``pairwise_auc`` (means over steps), and
        ``direction_accuracy`` for more than two classes.
    """
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
    comp = compression or CompressionConfig()
    codec_h, codec_g = comp.activations.codec(), comp.gradients.codec()
    model.train()
    for step in range(train_cfg.steps):
        idx = next(batches)
        for opt in (opt_a, opt_b):
            for group in opt.param_groups:
                group["lr"] = train_cfg.lr_at(step)
        h = alice(data.x_train[idx])                       # Alice's forward
        h_bob = roundtrip(h.detach(), codec_h, "step", step, "h").requires_grad_(True)  # what crosses the cut
        y = data.y_train[idx]                              # only Bob has these
        loss = F.cross_entropy(bob(h_bob), y)
        opt_b.zero_grad(set_to_none=True)
        loss.backward()
        sent = roundtrip(protect_gradient(h_bob.grad, y, protection, generator=noise), codec_g, "step", step, "g")
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


Transport = Literal["inprocess", "parties"]


def execute_run(run_id: str, spec: dict, deps: dict, root: str | None = None) -> dict:
    """One (method, scale, seed) run of the sweep (module level: the runner may call it in a worker process).

    ``spec["transport"] == "parties"`` runs it over real party processes (``governance.leakage.parties``) in
    ``root/<run id>``; otherwise in process (:func:`simulate_split`).
    """
    cfg = LeakageAuditConfig.model_validate(spec["config"])
    t0 = time.perf_counter()
    if spec.get("kind") == "inputs":  # Bob reconstructing Alice's inputs (governance.leakage.inputs)
        data = load_data(cfg.data)
        defense = InputProtectionConfig.model_validate(spec["defense"])
        res = simulate_inputs(data, cfg.model, cfg.cut, cfg.train, defense, cfg.inputs, spec["seed"], cfg.audit.init,
                              keep=INPUT_EXAMPLES if spec.get("examples") else 0)
        return {"kind": "inputs", "defense": defense_label(defense), "seed": spec["seed"], **res,
                "seconds": time.perf_counter() - t0}
    if spec.get("transport", "inprocess") == "parties":
        # (here, not at the top: only this transport needs gRPC, the party servers and the driver)
        from modelward.governance.leakage.parties import audit_over_parties

        folder = Path(root or ".") / run_id.replace("|", "_")
        res = audit_over_parties(cfg, folder, spec["method"], spec["scale"], spec["seed"], spec["positive"])
    else:
        data = load_data(cfg.data)
        protection = LabelProtectionConfig(method=spec["method"], scale=spec["scale"])
        res = simulate_split(data, cfg.model, cfg.cut, cfg.train, protection, spec["seed"], spec["positive"],
                             cfg.audit.init, cfg.compression)
    return {"method": spec["method"], "scale": spec["scale"], "seed": spec["seed"], **res,
            "seconds": time.perf_counter() - t0}


def plan_runs(cfg: LeakageAuditConfig, positive: int, transport: Transport = "inprocess") -> list[RunSpec]:
    """The sweep: no protection once (if 0 is among the scales), then every method × positive scale; each for
    every seed."""
    settings: list[tuple[str, float]] = [("none", 0.0)] if 0 in cfg.audit.scales or not cfg.audit.methods else []
    settings += [(m, float(s)) for m in dict.fromkeys(cfg.audit.methods) if m != "none"
                 for s in dict.fromkeys(cfg.audit.scales) if s > 0]
    conf = cfg.model_dump(mode="json")
    prefix = "parties|" if transport == "parties" else ""
    runs = [RunSpec(f"{prefix}{m}|{s:g}|{seed}", {"config": conf, "method": m, "scale": s, "seed": seed,
                                                  "positive": positive, "transport": transport})
            for m, s in settings for seed in dict.fromkeys(cfg.audit.seeds)]
    return runs + input_runs(cfg, transport)


INPUT_EXAMPLES = 8  # private rows shown per defense in reconstructions*.png


def input_runs(cfg: LeakageAuditConfig, transport: Transport = "inprocess") -> list[RunSpec]:
    """The input-reconstruction runs (``[inputs]``): one per defense and seed, in process (the attacks need Bob's
    part and what he received; the ``parties`` transport measures labels only)."""
    if not cfg.inputs.attacks or transport != "inprocess":
        return []
    conf = cfg.model_dump(mode="json")
    seeds = list(dict.fromkeys(cfg.inputs.seeds))
    return [RunSpec(f"inputs|{defense_label(d)}|{seed}", {"config": conf, "kind": "inputs", "seed": seed,
                                                          "defense": d.model_dump(mode="json"),
                                                          "examples": seed == seeds[0]})
            for d in cfg.inputs.defenses for seed in seeds]


INPUT_COLUMNS = ["defense", "attack", "seeds", "test_accuracy", "accuracy_cost", "ssim", "ssim_sd", "mse", "mse_sd",
                 "other_ssim", "other_mse", "mean_ssim", "mean_mse", "canary_auc", "grad_norm", "seconds"]


def aggregate_inputs(runs: list[dict]) -> list[dict]:
    """One row per (defense, attack): means (and SDs) over seeds of the reconstruction scores, the no-leak
    references next to them, and the defense's test accuracy and its cost against the first defense listed
    (points)."""
    rows: list[dict] = []
    ref: float | None = None
    for defense in dict.fromkeys(r["defense"] for r in runs):
        group = [r for r in runs if r["defense"] == defense]
        acc = summarize([r.get("test_accuracy") for r in group], skip_missing=True).mean
        ref = acc if ref is None else ref
        attacks = [k[:-4] for k in group[0] if k.endswith("_mse") and not k.startswith(("mean", "other"))
                   and not k.endswith("_other_mse")]
        for attack in attacks:
            row: dict = {"defense": defense, "attack": attack, "seeds": len(group), "test_accuracy": acc,
                         "accuracy_cost": 100 * (ref - acc)}
            training = attack if attack.startswith("fsha") else "honest"  # whose gradients Alice saw
            for key, col in ((f"{attack}_ssim", "ssim"), (f"{attack}_mse", "mse"),
                             (f"{attack}_other_ssim", "other_ssim"), (f"{attack}_other_mse", "other_mse"),
                             ("mean_ssim", "mean_ssim"), ("mean_mse", "mean_mse"),
                             (f"{training}_canary_auc", "canary_auc"), (f"{training}_grad_norm", "grad_norm")):
                st = summarize([r.get(key) for r in group], skip_missing=True)
                if st.n:
                    row[col] = st.mean
                    if col in ("ssim", "mse"):
                        row[f"{col}_sd"] = st.sd if st.n > 1 else None
            row["seconds"] = sum(r.get("seconds", 0.0) for r in group)
            rows.append(row)
    return rows


def aggregate(runs: list[dict]) -> list[dict]:
    """One row per (method, scale): means over seeds, and SDs of accuracy and the two AUCs."""
    rows: list[dict] = []
    for key in dict.fromkeys((r["method"], r["scale"]) for r in runs):
        group = [r for r in runs if (r["method"], r["scale"]) == key]
        row: dict = {"method": key[0], "scale": key[1], "seeds": len(group)}
        for metric in ("test_accuracy", "norm_auc", "direction_auc", "pairwise_auc", "direction_accuracy",
                       "direction_auc_acc", "direction_accuracy_acc"):
            st = summarize([r.get(metric) for r in group], skip_missing=True)
            if st.n:
                row[metric] = st.mean
                if metric in ("test_accuracy", "norm_auc", "direction_auc"):
                    row[f"{metric}_sd"] = st.sd if st.n > 1 else None  # undefined for one seed
        row["seconds"] = sum(r.get("seconds", 0.0) for r in group)
        rows.append(row)
    return rows


def audit_notes(cfg: LeakageAuditConfig, data: DataSplit, positive: int) -> list[str]:
    first = model_layers(build_model(cfg.model, data.input_shape, data.num_classes))[0].name
    binary = data.num_classes == 2
    return [
        f"- data {data.describe()}; model {cfg.model.arch}; Alice holds the layers up to {cfg.cut or first}; "
        f"{cfg.train.steps} steps of batch {cfg.train.batch_size}; seeds {cfg.audit.seeds}.",
        "- AUCs are computed per training batch from the gradient Alice received, then averaged over all steps "
        "(0.5 = chance); *_acc: each example's direction scores averaged over all epochs first (stronger).",
        (f"- binary: positive = class {positive} ({data.class_names[positive]}, the minority); norm attack = ||g|| "
         "(larger = positive; below 0.5 means the minority had the smaller norms), direction attack = cosine with "
         "one known positive example of the batch (Li et al. 2022)." if binary else
         "- multiclass: norm_auc and direction_auc are macro means of one-vs-rest AUCs over the classes; the "
         "direction attack knows one example of each class per batch; direction_accuracy = share of labels "
         "recovered as the class of the most similar known example (chance = 1/classes); pairwise_auc needs no "
         "label."),
        "- scale: Bob's noise power as a multiple of the squared distance between the batch's class-mean gradients.",
    ] + ([f"- compression (what crosses the cut; the attacks score the gradient Alice decodes): activations "
          f"{_described(cfg.compression.activations)}, gradients {_described(cfg.compression.gradients)}."]
         if cfg.compression != CompressionConfig() else [])


def _described(t: TensorCompression) -> str:
    """``none``, ``int8 (row)`` or ``topk (ratio 0.1)``: one [compression] entry, for the results' notes."""
    if t.method == "int8":
        return f"int8 ({t.scale}{', stochastic' if t.stochastic else ''})"
    return f"topk (ratio {t.ratio:g})" if t.method == "topk" else "none"


class LeakageStudy(Study[LeakageAuditConfig, list[dict]]):
    """The label-leakage sweep in the core study frame (one run per method × scale × seed).

    Args:
        transport: ``inprocess`` or ``parties`` (see :func:`run_audit`).
    """

    name = "leakage audit"
    config_model = LeakageAuditConfig

    def __init__(self, transport: Transport = "inprocess") -> None:
        self.transport = transport

    def label(self, cfg: LeakageAuditConfig) -> str:
        return self.name + (" (party processes)" if self.transport == "parties" else "")

    def plan(self, cfg: LeakageAuditConfig, ctx: StudyContext) -> list[RunSpec]:
        data = load_data(cfg.data)
        return plan_runs(cfg, _positive(data, cfg.audit.positive), self.transport)

    def execute(self, cfg: LeakageAuditConfig, ctx: StudyContext) -> Execute:
        if self.transport == "parties":
            return functools.partial(execute_run, root=str(ctx.out / "parties"))
        return execute_run

    def summarize(self, cfg: LeakageAuditConfig, ctx: StudyContext, outcome: RunOutcome) -> list[dict]:
        data = load_data(cfg.data)
        positive = _positive(data, cfg.audit.positive)
        plan = plan_runs(cfg, positive, self.transport)
        if outcome.failed:
            first = next(iter(outcome.failed.items()))
            raise ModelwardError(f"{len(outcome.failed)} of {len(plan)} runs failed (re-run to retry); first: "
                                 f"{first[0]}: {first[1].strip().splitlines()[-1]}")
        results = ctx.ledger.results()
        runs = [results[r.run_id] for r in plan if r.spec.get("kind") != "inputs"]
        inputs = [results[r.run_id] for r in plan if r.spec.get("kind") == "inputs"]
        if inputs:
            write_inputs(ctx.out, cfg, data, inputs)
        rows = aggregate(runs)
        suffix = "_parties" if self.transport == "parties" else ""
        notes = audit_notes(cfg, data, positive)
        if self.transport == "parties":
            notes.append("- over real party processes (mutual TLS, 127.0.0.1): each party drew its own initial "
                         "parameters and Bob his own noise from the OS CSPRNG; Alice's server recorded the gradients.")
        write_table(ctx.out, f"results{suffix}", rows, COLUMNS, title=f"Label leakage audit: {data.name}"
                    + (" (party processes)" if suffix else ""), notes=notes)
        atomic_write_json(ctx.out / f"runs{suffix}.json", runs)
        tradeoff_plot(ctx.out / f"tradeoff{suffix}.png", rows, f"label leakage vs accuracy: {data.name}")
        return rows


def write_inputs(out: Path, cfg: LeakageAuditConfig, data: DataSplit, runs: list[dict]) -> list[dict]:
    """``inputs.{csv,md,json}``, ``inputs_runs.json`` and one ``reconstructions_<defense>.png`` per defense."""
    rows = aggregate_inputs(runs)
    images = data.is_image and data.x_train.dim() == 4
    notes = [
        f"- data {data.describe()}; model {cfg.model.arch}, Alice holds the layers up to {cfg.cut or 'the first'}; "
        f"{cfg.train.steps} steps of batch {cfg.train.batch_size}; seeds {cfg.inputs.seeds}; "
        f"{cfg.inputs.aux_fraction:.0%} of the training rows are public (Bob's auxiliary data), Alice trains on "
        f"the rest; {cfg.inputs.rows} of her rows reconstructed per run from the last activation Bob received.",
        "- attacks: decoder = He et al. 2019 query-free (surrogate of Alice's part through Bob's frozen part + "
        "decoder trained on the auxiliary data; adaptive: trained on equally noisy features); unsplit = Erdogan et "
        "al. 2022 (inputs and surrogate optimised jointly); fsha = Pasquini et al. 2021 (Bob returns his "
        "adversarial gradient instead of the task's, every step).",
        ("- ssim: mean per-row SSIM (1 = identical, images in [0, 1]); mse per pixel. No-leak references: "
         "mean_* = the auxiliary mean image for every row; other_* = the attack's own reconstructions scored "
         "against other rows (looking like a typical input, with no row-specific information)." if images else
         "- mse per (standardised) feature; no-leak references: mean_mse = the auxiliary mean for every row, "
         "other_mse = the attack's reconstructions scored against other rows."),
        "- test_accuracy: the honest training with Alice's defense (for fsha the task is never trained); "
        "accuracy_cost: points below the first defense listed.",
        f"- what Alice sees of the gradients (a hijacking detector's inputs), in the training the attack used: "
        f"canary_auc = do the epoch-averaged gradients of {cfg.inputs.canaries} public canary rows mixed into the "
        "training (labels known to Alice) point more alike for the same label than for different labels (AUC, "
        "0.5 = no; the Gradient Scrutinizer's test); grad_norm = mean gradient row norm over the last tenth of "
        "the steps.",
    ]
    write_table(out, "inputs", rows, INPUT_COLUMNS, title=f"Input reconstruction audit: {data.name}", notes=notes)
    atomic_write_json(out / "inputs_runs.json", [{k: v for k, v in r.items() if k != "examples"} for r in runs])
    for r in runs:
        if r.get("examples"):
            slug = r["defense"].replace(" + ", "_").replace(" ", "")
            reconstructions_plot(out / f"reconstructions_{slug}.png", r["examples"],
                                 f"{data.name}: Bob's reconstructions of Alice's private rows, Alice's defense: "
                                 f"{r['defense']} (seed {r['seed']})")
    return rows


def run_audit(cfg: LeakageAuditConfig, out_dir: str | Path, progress: ProgressSink | None = None, *,
              workers: int = 1, executor: str = "local", address: str | None = None,
              transport: Transport = "inprocess") -> list[dict]:
    """Run (or resume) the sweep in `out_dir`; write results.csv/md/json, runs.json and tradeoff.png.

    Args:
        cfg: the audit configuration.
        out_dir: output folder; its ledger (``ledger.sqlite``) makes a re-run resume (on resume only execution
            settings may change, as for every study: :data:`modelward.core.study.EXECUTION_SETTINGS`).
        progress: receives one unit per run.
        workers, executor, address: where the runs execute (see :func:`modelward.core.runner.run_plan`).
        transport: ``inprocess`` (the split simulated in this process, fast) or ``parties`` (every run trains
            over two real ``party serve`` processes with mutual TLS on 127.0.0.1; Alice's server records what it
            receives). The parties results go to ``results_parties.*``, ``runs_parties.json`` and
            ``tradeoff_parties.png``.
    Returns:
        One row per (method, scale) with means (and SDs over seeds) of accuracy and attack AUCs.

    Example:
        >>> rows = run_audit(LeakageAuditConfig(), "leakage-out")  # doctest: +SKIP
    """
    return run_study(LeakageStudy(transport), cfg, Path(out_dir).resolve(), workers=workers, executor=executor,
                     address=address, progress=progress)


def tradeoff_plot(path: Path, rows: list[dict], title: str) -> Path:
    """Test accuracy against label-recovery AUC (norm and direction attacks), one curve per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("direction_auc", "direction attack (per batch)"),
              ("direction_auc_acc", "direction attack, averaged over epochs"), ("norm_auc", "norm attack")]
    panels = [(k, n) for k, n in panels if any(k in r for r in rows)]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4), sharey=True, squeeze=False)
    base = [r for r in rows if r["method"] == "none"]
    for ax, (key, name) in zip(axes[0], panels, strict=True):
        for method in dict.fromkeys(r["method"] for r in rows if r["method"] != "none"):
            pts = base + [r for r in rows if r["method"] == method]
            xs, ys = [r.get(key, float("nan")) for r in pts], [r["test_accuracy"] for r in pts]
            ax.plot(xs, ys, marker="o", label=method)
            for r, x, y in zip(pts, xs, ys, strict=True):
                ax.annotate(f"{r['scale']:g}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
        if base and not any(r["method"] != "none" for r in rows):
            ax.plot([base[0][key]], [base[0]["test_accuracy"]], marker="o", label="none")
        ax.axvline(0.5, color="grey", lw=0.8, ls="--")
        ax.set_xlabel(f"label-recovery AUC: {name}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("test accuracy")
    fig.suptitle(f"{title} (labels: noise scale)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
