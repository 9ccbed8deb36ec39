"""``modelward privacy audit``: a resumable membership-inference audit over repetitions (seed 002 §8.3.3, App. C).

Per repetition r the data (train and test splits of the configured source, pooled) are split at random into
members (¼, the target's training set), non-members (¼) and the attacker's hold-out (½). The plan, run through
:func:`modelward.core.runner.run_plan` over the study ledger:

* ``target|r`` — train the target with algorithm A (``[model]``, ``[train]``) and the ``[defense]`` (none /
  dropout / DP-SGD through Opacus, whose ε is recorded with its accountant); saved as safetensors;
* ``shadows|r`` — the shadow / reference pool (``[shadows]``; trained once, stacked where exact) that shadow-bb,
  loss, LiRA and RMIA reuse; ``pool = "all"`` trains on random halves of the evaluation points plus the hold-out
  (LiRA / RMIA online), ``"holdout"`` on the hold-out only;
* ``proxies|r`` — the proxy models of the target's last linear layer (bayesian-wb's 10 on bootstrap samples of
  the hold-out, nn-wb's final one), trained once on the target's features and reused by those attacks;
* ``attack|<label>|r`` — fit one attack on the hold-out (+ shadows), score the balanced evaluation set, save the
  scores and the true membership (``scores/<label>_r<r>.scores.npy`` / ``.members.npy`` / ``.scores.csv``), and
  record the metrics (plus calibrated rows ``<label>@α`` for each ``calibrate`` percentile, App. C).

Outputs: ``results.csv/md/json`` (mean ± SD over repetitions per attack, with the ε lower bound), ``runs.json``
(every run's metrics), ``slices.*`` (per class and correct / misclassified: AUC, TPR at 1 % FPR, ε_lb; the worst
slice marked) and ``exposed.*`` (the 20 most exposed members with an interval, :mod:`.risk`),
``targets.csv/md/json`` (target accuracies, DP ε, advantage-bound checks), ``roc.png`` (log-scale FPR) and the
score arrays.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from modelward.core.config import AlgorithmSpec, StrictModel
from modelward.core.data import DataConfig, load_data
from modelward.core.device import DeviceSetting
from modelward.core.io import load_into, load_state_dict, save_state_dict
from modelward.core.progress import ProgressSink
from modelward.core.records import atomic_write_json, write_table
from modelward.core.runner import Execute, RunOutcome, RunSpec
from modelward.core.stats import summarize
from modelward.core.study import Study, StudyContext, run_study
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError, ModelwardError
from modelward.privacy import metrics
from modelward.privacy.dp import DPConfig, add_dropout, check_advantage, train_dp
from modelward.privacy.membership import ATTACKS, NEEDS_SHADOWS, AttackData, make_membership_attack
from modelward.privacy.membership.calibration import calibrated_threshold
from modelward.privacy.membership.proxies import cached_tops, load_tops, save_tops
from modelward.privacy.protocol import membership_split
from modelward.privacy.risk import exposed_records, slice_risk
from modelward.privacy.shadows import ModelTrainer, ShadowPool, logits_of
from modelward.privacy.slicing import last_linear


class SplitConfig(StrictModel):
    train: float = Field(0.25, gt=0.0, lt=1.0)  # members
    test: float = Field(0.25, gt=0.0, lt=1.0)  # non-members; the rest is the attacker's hold-out


class DefenseConfig(StrictModel):
    kind: Literal["none", "dropout", "dp"] = "none"
    dropout: float = Field(0.5, ge=0.0, lt=1.0)
    dp: DPConfig = Field(default_factory=DPConfig)

    @model_validator(mode="after")
    def _dp_needs(self) -> DefenseConfig:
        if self.kind == "dp" and self.dp.target_epsilon is None and self.dp.noise_multiplier is None:
            raise ValueError("defense.kind='dp' needs defense.dp.target_epsilon or defense.dp.noise_multiplier")
        return self


class ShadowConfig(StrictModel):
    count: int = Field(16, ge=2)
    pool: Literal["all", "holdout"] = "all"
    stacked: bool = True


class MembershipAttackSpec(AlgorithmSpec):
    """One attack row (``name``, ``params``, ``label``); ``calibrate`` adds App. C percentile-calibrated rows."""

    calibrate: list[float] = Field(default_factory=list)  # App. C percentiles, e.g. [0.9, 0.99]

    @model_validator(mode="after")
    def _known(self) -> MembershipAttackSpec:
        if self.name not in ATTACKS:
            raise ValueError(f"unknown attack {self.name!r}; valid choices: {ATTACKS.names()}")
        bad = sorted(set(self.params) - set(ATTACKS.parameters(self.name)))
        if bad:
            raise ValueError(f"attack {self.name!r}: unknown parameter(s) {bad}; valid: "
                             f"{ATTACKS.parameters(self.name)}")
        if any(not 0 < a < 1 for a in self.calibrate):
            raise ValueError("calibrate percentiles must lie in (0, 1), e.g. [0.9, 0.99]")
        return self


class AuditConfig(StrictModel):
    """One membership-inference audit (see examples/privacy_bcw.toml).

    Args:
        name: the study's name.
        seed: base seed (each repetition derives its own).
        repetitions: independent repetitions (targets, splits, attacks) averaged in the tables.
        data: the data source; model / init / train: the target's architecture, initialiser and training.
        split: the member / non-member / hold-out fractions.
        defense: an optional defence of the target (e.g. DP-SGD).
        shadows: the shared shadow pool's size and training.
        attacks: the attacks to run (``[[attacks]]`` with ``name``, ``params``, ``label``, ``calibrate``);
            labels must be distinct.
        device: where models train (not part of the fingerprint: an audit may resume on another device).

    Returns:
        A validated, strict config (unknown keys raise) for :func:`run_audit`.

    Example:
        >>> [a.name for a in AuditConfig(repetitions=2).attacks]
        ['naive', 'loss']
    """

    name: str = "audit"
    seed: int = 0
    repetitions: int = Field(1, ge=1)
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=lambda: ModelConfig(arch="mlp", hidden=[128]))
    train: TrainConfig = Field(default_factory=lambda: TrainConfig(lr=0.1, batch_size=32, steps=1000))
    init: str = "glorot_uniform"
    split: SplitConfig = Field(default_factory=SplitConfig)
    defense: DefenseConfig = Field(default_factory=DefenseConfig)
    shadows: ShadowConfig = Field(default_factory=ShadowConfig)
    attacks: list[MembershipAttackSpec] = Field(
        default_factory=lambda: [MembershipAttackSpec(name="naive"), MembershipAttackSpec(name="loss")])
    # where the target, shadow and reference models train (docs/devices.md; DP-SGD targets train on the CPU);
    # the attacks score on the CPU. Not part of the audit's fingerprint: it may resume on another device
    device: DeviceSetting = "cpu"

    @model_validator(mode="after")
    def _unique(self) -> AuditConfig:
        keys = [a.key for a in self.attacks]
        dup = sorted({k for k in keys if keys.count(k) > 1})
        if dup:
            raise ValueError(f"attacks: duplicate label(s) {dup}; give each a distinct 'label'")
        if not self.attacks:
            raise ValueError("attacks: list at least one attack, e.g. [[attacks]] name = 'naive'")
        if self.split.train + self.split.test >= 1:
            raise ValueError("split: train + test must be < 1 (the rest is the hold-out)")
        return self


# ---------------------------------------------------------------------------------------------------------------
# the pieces every run rebuilds from the config (cheap, deterministic)
def _pooled(cfg: AuditConfig) -> tuple[torch.Tensor, torch.Tensor, int, tuple[int, ...]]:
    d = load_data(cfg.data)
    return torch.cat([d.x_train, d.x_test]), torch.cat([d.y_train, d.y_test]), d.num_classes, d.input_shape


def _factory(cfg: AuditConfig, shape: tuple[int, ...], classes: int, dropout: bool) -> Any:
    def make() -> torch.nn.Module:
        m = build_model(cfg.model, shape, classes)
        return add_dropout(m, cfg.defense.dropout) if dropout else m

    return make


def _setup(cfg: AuditConfig, rep: int) -> dict[str, Any]:
    x, y, classes, shape = _pooled(cfg)
    split = membership_split(x, y, cfg.seed * 1000 + rep, cfg.split.train, cfg.split.test)
    trainer = ModelTrainer(_factory(cfg, shape, classes, cfg.defense.kind == "dropout"), cfg.train, cfg.init,
                           device=cfg.device)
    return {"split": split, "trainer": trainer, "classes": classes, "shape": shape}


def _acc(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    return float((logits_of(model, x).argmax(1) == y).float().mean()) if len(x) else float("nan")


def _train_target(cfg: AuditConfig, out: Path, rep: int) -> dict[str, Any]:
    s = _setup(cfg, rep)
    sp, trainer = s["split"], s["trainer"]
    seed = cfg.seed * 1000 + rep
    res: dict[str, Any] = {}
    if cfg.defense.kind == "dp":
        model = trainer.build(seed)
        rep_dp = train_dp(model, sp.x_in, sp.y_in, cfg.defense.dp, seed)
        res |= {f"dp_{k}": v for k, v in rep_dp.as_dict().items()}
    else:
        model = trainer.train(sp.x_in, sp.y_in, seed)
    save_state_dict(out / "models" / f"target_r{rep}.safetensors", model.state_dict())
    res |= {"train_accuracy": _acc(model, sp.x_in, sp.y_in), "test_accuracy": _acc(model, sp.x_out, sp.y_out),
            "n_members": len(sp.x_in), "n_nonmembers": len(sp.x_out), "n_holdout": len(sp.x_aux)}
    return res


def _load_target(cfg: AuditConfig, out: Path, rep: int, s: dict[str, Any]) -> torch.nn.Module:
    model = s["trainer"].factory()
    path = out / "models" / f"target_r{rep}.safetensors"
    load_into(model, load_state_dict(path)[0], path)
    return model.eval()


def _pool_data(cfg: AuditConfig, sp: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if cfg.shadows.pool == "holdout":
        return sp.x_aux, sp.y_aux
    xe, ye, _ = sp.evaluation()
    return torch.cat([xe, sp.x_aux]), torch.cat([ye, sp.y_aux])


def _train_shadows(cfg: AuditConfig, out: Path, rep: int) -> dict[str, Any]:
    s = _setup(cfg, rep)
    xp, yp = _pool_data(cfg, s["split"])
    # shadows imitate A without DP noise (the attacker's approximation; Opacus training cannot be stacked)
    pool = ShadowPool.train(s["trainer"], xp, yp, cfg.shadows.count, seed=cfg.seed * 1000 + rep + 77,
                            stacked=cfg.shadows.stacked)
    pool.save(out / "models" / f"shadows_r{rep}.safetensors")
    accs = [_acc(m, s["split"].x_out, s["split"].y_out) for m in pool.models]
    return {"count": len(pool.models), "pool_size": len(xp), "mean_test_accuracy": float(np.mean(accs))}


def proxy_needs(cfg: AuditConfig) -> list[tuple[int, bool]]:
    """The (count, bootstrap) proxy sets of the last linear layer that the configured attacks use."""
    needs = []
    for a in cfg.attacks:
        if a.name == "bayesian_wb" and a.params.get("layer") is None:
            needs.append((int(a.params.get("proxies", 10)), bool(a.params.get("bootstrap", True))))
        if a.name == "nn_wb" and a.params.get("layer") is None:
            needs.append((1, False))  # nn-wb's final proxy: one model on all of the hold-out
    return sorted(set(needs))


def _train_proxies(cfg: AuditConfig, out: Path, rep: int) -> dict[str, Any]:
    s = _setup(cfg, rep)
    sp = s["split"]
    target = _load_target(cfg, out, rep, s)
    data = AttackData(target, sp.x_aux, sp.y_aux, s["classes"], s["trainer"], seed=cfg.seed * 1000 + rep)
    layer = last_linear(target)
    for count, boot in proxy_needs(cfg):
        cached_tops(data, layer, count, boot)
    save_tops(str(out / "models" / f"proxies_r{rep}.safetensors"), data.cache, layer)
    return {"layer": layer, "sets": [k for k in data.cache]}


def _attack(cfg: AuditConfig, out: Path, rep: int, spec: MembershipAttackSpec) -> dict[str, Any]:
    s = _setup(cfg, rep)
    sp = s["split"]
    target = _load_target(cfg, out, rep, s)
    shadows = None
    if (out / "models" / f"shadows_r{rep}.safetensors").is_file():
        shadows = ShadowPool.load(out / "models" / f"shadows_r{rep}.safetensors", s["trainer"].factory)
    data = AttackData(target, sp.x_aux, sp.y_aux, s["classes"], s["trainer"], shadows, seed=cfg.seed * 1000 + rep)
    proxies = out / "models" / f"proxies_r{rep}.safetensors"
    if proxies.is_file():  # the proxies run trained them once for every attack of this repetition

        load_tops(str(proxies), data)
    attack = make_membership_attack(spec.name, **spec.params).fit(data)
    xe, ye, members = sp.evaluation()
    scores = attack.score(xe, ye)
    rows = {}
    thresholds = [(spec.key, attack.threshold)]
    if spec.calibrate:
        hold = attack.score(sp.x_aux, sp.y_aux)
        thresholds += [(f"{spec.key}@{a:g}", calibrated_threshold(hold, a)) for a in spec.calibrate]
    for label, thr in thresholds:
        rows[label] = metrics.evaluate(scores, members, thr).as_dict() | {"threshold": float(thr)}
    metrics.save_scores(out / "scores", f"{spec.key}_r{rep}", scores, members, threshold=attack.threshold)
    return {"rows": rows} | _risk(target, xe, ye, scores, members, sp)


def _risk(target: torch.nn.Module, xe: torch.Tensor, ye: torch.Tensor, scores: np.ndarray, members: np.ndarray,
          sp: Any) -> dict[str, Any]:
    """Per-slice risk and the most exposed records of one attack run (:mod:`modelward.privacy.risk`)."""
    correct = (logits_of(target, xe).argmax(1) == ye).numpy()
    slices, worst = slice_risk(scores, members, ye.numpy(), correct)
    return {"slices": slices, "worst_slice": worst,
            "exposed": exposed_records(scores, members, record_ids=sp.evaluation_indices())}


def execute_run(run_id: str, spec: dict[str, Any], deps: dict[str, dict[str, Any]], *, out: str) -> dict[str, Any]:
    """One run of the audit plan (module-level and picklable, as the runner requires; ``out`` is bound with
    ``functools.partial`` so the study folder can be moved without changing the recorded specs)."""
    cfg = AuditConfig.model_validate(spec["config"])
    folder = Path(out)
    rep = int(spec["rep"])
    if spec["kind"] == "target":
        return _train_target(cfg, folder, rep)
    if spec["kind"] == "shadows":
        return _train_shadows(cfg, folder, rep)
    if spec["kind"] == "proxies":
        return _train_proxies(cfg, folder, rep)
    attack = next(a for a in cfg.attacks if a.key == spec["attack"])
    return _attack(cfg, folder, rep, attack)


def plan_runs(cfg: AuditConfig) -> list[RunSpec]:
    base = {"config": cfg.model_dump(mode="json")}
    need_shadows = any(a.name in NEEDS_SHADOWS for a in cfg.attacks)
    plan = []
    for r in range(cfg.repetitions):
        plan.append(RunSpec(f"target|{r}", base | {"kind": "target", "rep": r}))
        deps: tuple[str, ...] = (f"target|{r}",)
        if need_shadows:
            plan.append(RunSpec(f"shadows|{r}", base | {"kind": "shadows", "rep": r}))
            deps = (*deps, f"shadows|{r}")
        if proxy_needs(cfg):
            plan.append(RunSpec(f"proxies|{r}", base | {"kind": "proxies", "rep": r}, depends_on=(f"target|{r}",)))
            deps = (*deps, f"proxies|{r}")
        for a in cfg.attacks:
            plan.append(RunSpec(f"attack|{a.key}|{r}", base | {"kind": "attack", "rep": r, "attack": a.key},
                                depends_on=deps))
    return plan


COLUMNS = ["attack", "accuracy", "accuracy_sd", "advantage", "precision", "precision_sd", "auc",
           "tpr_at_0_1pct_fpr", "tpr_at_1pct_fpr", "epsilon_lb", "fpr", "tpr", "repetitions"]


def aggregate(cfg: AuditConfig, results: dict[str, dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    """(one row per attack label: means over repetitions (± SD), one row per run)."""
    per: dict[str, list[dict]] = {}
    runs = []
    for r in range(cfg.repetitions):
        for a in cfg.attacks:
            res = results.get(f"attack|{a.key}|{r}")
            if res is None:
                continue
            for label, m in res["rows"].items():
                per.setdefault(label, []).append(m)
                runs.append({"attack": label, "repetition": r} | m)
    rows = []
    for label, ms in per.items():
        row: dict[str, Any] = {"attack": label, "repetitions": len(ms)}
        for k in ("accuracy", "advantage", "precision", "auc", "tpr_at_0_1pct_fpr", "tpr_at_1pct_fpr", "epsilon_lb",
                  "fpr", "tpr"):
            s = summarize([m.get(k, float("nan")) for m in ms])
            row[k] = s.mean
            if k in ("accuracy", "precision"):
                row[f"{k}_sd"] = s.sd
        rows.append(row)
    return rows, runs


def target_rows(cfg: AuditConfig, results: dict[str, dict[str, Any]], attack_rows: list[dict]) -> list[dict]:
    rows = []
    best = max((r["advantage"] for r in attack_rows), default=float("nan"))
    for r in range(cfg.repetitions):
        t = results.get(f"target|{r}")
        if t is None:
            continue
        row = {"repetition": r, "train_accuracy": t["train_accuracy"], "test_accuracy": t["test_accuracy"],
               "n_members": t["n_members"], "n_holdout": t["n_holdout"]}
        if "dp_epsilon" in t:
            chk = check_advantage(best, 2 * t["n_members"], t["dp_epsilon"], t["dp_delta"])
            row |= {"epsilon": t["dp_epsilon"], "delta": t["dp_delta"], "accountant": t["dp_accountant"],
                    "noise_multiplier": t["dp_noise_multiplier"], "best_attack_advantage": best,
                    "bound_eps_delta": chk["bound_eps_delta"], "bound_yeom": chk["bound_yeom"],
                    "within_bound": chk["within"]}
        rows.append(row)
    return rows


class AuditStudy(Study[AuditConfig, list[dict]]):
    """The membership-inference audit in the core frame: target and shadow trainings, then every attack."""

    name = "privacy audit"
    config_model = AuditConfig

    def check(self, cfg: AuditConfig, out: Path) -> None:
        _pooled(cfg)  # fail early on a bad data source

    @contextmanager
    def session(self, cfg: AuditConfig, ctx: StudyContext) -> Iterator[None]:
        (ctx.out / "models").mkdir(exist_ok=True)
        yield

    def plan(self, cfg: AuditConfig, ctx: StudyContext) -> list[RunSpec]:
        return plan_runs(cfg)

    def execute(self, cfg: AuditConfig, ctx: StudyContext) -> Execute:
        return partial(execute_run, out=str(ctx.out.resolve()))

    def summarize(self, cfg: AuditConfig, ctx: StudyContext, outcome: RunOutcome) -> list[dict]:
        if outcome.failed:
            first = next(iter(outcome.failed.items()))
            raise ModelwardError(f"{len(outcome.failed)} of {outcome.total} runs failed (re-run to retry); first: "
                                 f"{first[0]}: {first[1].strip().splitlines()[-1]}")
        results = ctx.ledger.results()
        rows, runs = aggregate(cfg, results)
        targets = target_rows(cfg, results, rows)
        notes = [f"data: {cfg.data.source}; {cfg.repetitions} random {cfg.split.train:g}/{cfg.split.test:g}/"
                 f"{1 - cfg.split.train - cfg.split.test:g} splits (members / non-members / hold-out); "
                 f"defense: {cfg.defense.kind}",
                 "accuracy on the balanced evaluation set; advantage = 2(accuracy − ½); precision := ½ when no point is "
                 "predicted a member; `@α` rows: threshold at the α-percentile of hold-out scores (App. C)",
                 "score arrays: scores/<attack>_r<rep>.scores.npy / .members.npy / .scores.csv",
                 "epsilon_lb: best Clopper–Pearson ε lower bound over thresholds (95 %, δ = 0; TF Privacy's method, "
                 "maximised over thresholds after the fact)"]
        if targets and "epsilon" in targets[0]:
            t0 = targets[0]
            notes.append(f"DP-SGD: ε = {t0['epsilon']:.3g} at δ = {t0['delta']:.3g} ({t0['accountant']} accountant); "
                         f"advantage bound (ε, δ): {t0['bound_eps_delta']:.3f}; Yeom e^ε − 1: {t0['bound_yeom']:.3f}")
        write_table(ctx.out, "results", rows, COLUMNS, title=f"{cfg.name}: membership inference", notes=notes)
        write_table(ctx.out, "targets", targets, title=f"{cfg.name}: target models")
        atomic_write_json(ctx.out / "runs.json", runs)
        _write_risk(cfg, ctx.out, results)
        _roc(cfg, ctx.out)
        return rows


def run_audit(cfg: AuditConfig, out_dir: str | Path, progress: ProgressSink | None = None, *, workers: int = 1,
              executor: str = "local", address: str | None = None) -> list[dict]:
    """Run (or resume) the audit in ``out_dir``; write the tables, score arrays and ``roc.png``.

    Args:
        cfg: :class:`AuditConfig`; out_dir: the study folder (its ``ledger.sqlite`` makes a re-run resume).
        workers / executor / address: passed to :func:`modelward.core.runner.run_plan`.
        progress: one unit per run.
    Returns:
        one row per attack label with means over repetitions.

    Example:
        >>> rows = run_audit(AuditConfig(), "privacy-out")  # doctest: +SKIP
        >>> len(rows)  # one row per attack label  # doctest: +SKIP
    """
    return run_study(AuditStudy(), cfg, out_dir, workers=workers, executor=executor, address=address,
                     progress=progress)


def _write_risk(cfg: AuditConfig, out: Path, results: dict[str, dict[str, Any]]) -> None:
    """``slices.*`` (per attack, repetition and slice, the worst slice marked) and ``exposed.*`` (the 20 most
    exposed members per attack and repetition; ``record`` = position in the pooled train + test data)."""
    slices, exposed = [], []
    for r in range(cfg.repetitions):
        for a in cfg.attacks:
            res = results.get(f"attack|{a.key}|{r}") or {}
            worst = (res.get("worst_slice") or {}).get("slice")
            slices += [{"attack": a.key, "repetition": r} | s | {"worst": s["slice"] == worst}
                       for s in res.get("slices", [])]
            exposed += [{"attack": a.key, "repetition": r} | e for e in res.get("exposed", [])]
    if slices:
        write_table(out, "slices", slices, title=f"{cfg.name}: membership risk per slice",
                    notes=["worst: the ranked slice (≥ 20 members and non-members) with the highest TPR at 1 % FPR",
                           "epsilon_lb: Clopper–Pearson ε lower bound (95 %, δ = 0), best threshold"])
    if exposed:
        write_table(out, "exposed", exposed, title=f"{cfg.name}: the most exposed training records",
                    notes=["exposure_fpr: share of non-members scoring at least as high (the FPR at which the "
                           "record is flagged); [fpr_low, fpr_high]: 95 % Clopper–Pearson interval; record: "
                           "position in the pooled train + test data"])


def _roc(cfg: AuditConfig, out: Path) -> None:
    from modelward.privacy.figures import roc_plot  # matplotlib on first figure only

    curves = {}
    for a in cfg.attacks:
        s_parts, m_parts = [], []
        for r in range(cfg.repetitions):
            f = out / "scores" / f"{a.key}_r{r}.scores.npy"
            if f.is_file():
                s_parts.append(np.load(f))
                m_parts.append(np.load(out / "scores" / f"{a.key}_r{r}.members.npy"))
        if s_parts and a.name != "naive":
            fpr, tpr, _ = metrics.roc_curve(np.concatenate(s_parts), np.concatenate(m_parts))
            curves[a.key] = (fpr, tpr)
    if curves:
        roc_plot(out / "roc.png", curves, f"{cfg.name}: ROC (scores pooled over repetitions)")


def check_config(cfg: AuditConfig) -> None:
    if cfg.defense.kind == "dp" and cfg.model.batch_norm and cfg.model.arch != "mlp":
        raise ConfigError("defense.kind='dp': Opacus cannot train batch norm; set model.batch_norm = false")
