"""Extraction evaluation harness (seed 003 §4.1–4.2; Tables 2–5 layout, Fig. 3 sweep, Fig. 5 right).

For every defense × ε × attack × seed: train a substitute through the attack and record the extraction accuracy
(best over substitute epochs, as the official code), the fidelity at that epoch (agreement with the victim's clean
top-1), the max/mean ℓ1 distortion of the answers, the protected accuracy (victim's accuracy through the defense)
and, where the clean predictions are known, the mean recovery distance ‖ỹ − y‖₂. Per defense the worst case is the
maximum over attacks. Cells are runs of a :class:`~modelward.core.ledger.RunLedger`, so an interrupted evaluation
resumes where it stopped. Outputs (run directory): ``config.json``, ``results.csv`` (one row per cell),
``worst_case.csv``, ``results.md`` (the paper's table layout), ``accuracy_vs_epsilon.png``,
``centroids_vs_queries.png`` (+ ``centroids.csv``).

The victim is trained here (cached per configuration under ``victim.cache_dir``), optionally temperature-scaled
(softmax(z/T): a less confident victim, digest §13.3), and queried locally (model + defense), through the guarded
HTTP service on 127.0.0.1 (``victim.serve = true``), or at a remote URL (``victim.url``).
"""

from __future__ import annotations

import copy
import csv
import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, model_validator
from rich.console import Console
from torch import nn

from modelward.core.config import StrictModel, dump_config
from modelward.core.data import DataConfig, DataSplit, load_data
from modelward.core.io import load_state_dict, save_state_dict
from modelward.core.ledger import RunLedger
from modelward.core.progress import make_progress
from modelward.core.train import TrainConfig, train
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError
from modelward.extraction.attacks import (
    ATTACK_STRATEGIES,
    QUERY_STRATEGIES,
    EvalSet,
    SubstituteConfig,
    TransferSet,
    knowledge_from_defense,
    make_attack,
)
from modelward.extraction.attacks.base import AttackKnowledge, seeded_model
from modelward.extraction.defenses import DEFENSES, PredictionDefense, make_defense


# ---------------------------------------------------------------------------------------------------------------
# configuration
class VictimConfig(StrictModel):
    """The defended model: architecture, training, temperature, and where it is queried."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=lambda: TrainConfig(steps=400, lr=0.05, batch_size=64))
    victim_fraction: float = Field(0.5, gt=0.0, lt=1.0)  # share of the train split the victim learns from
    temperature: float = Field(1.0, gt=0.0)  # served probabilities are softmax(z / T)
    seed: int = 0
    cache_dir: str = "~/.cache/modelward/extraction"
    serve: bool = False  # query the local victim through the guarded HTTP service (127.0.0.1)
    url: str | None = None  # a remote guarded endpoint instead of a local model
    model_name: str = "victim"
    api_key: str | None = None
    misinformation_steps: int = Field(300, ge=1)  # AM's misinformation model (trained with −log(1 − f̂_y))


class TransferConfig(StrictModel):
    """The attacker's query pool: the held-out part of the victim's train split, uniform noise, or other data."""

    source: Literal["pool", "noise", "data"] = "pool"
    size: int = Field(1000, ge=1)  # for source = "noise"
    data: DataConfig | None = None  # for source = "data" (its train split is the pool)
    seed: int = 123

    @model_validator(mode="after")
    def _needs_data(self) -> TransferConfig:
        if self.source == "data" and self.data is None:
            raise ValueError("transfer.source='data' needs a [transfer.data] table (a data source)")
        return self


class DefenseSpec(StrictModel):
    """One defense column; ``epsilons`` sweeps its ε (ℓ1 budget) — one column per value."""

    name: str
    params: dict[str, Any] = Field(default_factory=dict)
    epsilons: list[float] = Field(default_factory=list)
    label: str | None = None
    attacks: list[str] = Field(default_factory=list)  # attack rows (labels) to run here; empty = all

    @model_validator(mode="after")
    def _known(self) -> DefenseSpec:
        if self.name not in DEFENSES:
            raise ValueError(f"unknown defense {self.name!r}; valid choices: {sorted(DEFENSES)}")
        if any(not 0 <= e <= 2 for e in self.epsilons):
            raise ValueError("epsilons must lie in [0, 2] (ℓ1 distance between probability vectors)")
        return self


class AttackSpec(StrictModel):
    """One attack row: a query strategy × an attack strategy."""

    query: str = "knockoff"
    strategy: str = "naive"
    query_params: dict[str, Any] = Field(default_factory=dict)
    strategy_params: dict[str, Any] = Field(default_factory=dict)
    label: str | None = None

    @model_validator(mode="after")
    def _known(self) -> AttackSpec:
        if self.query not in QUERY_STRATEGIES:
            raise ValueError(f"unknown query strategy {self.query!r}; valid choices: {sorted(QUERY_STRATEGIES)}")
        if self.strategy not in ATTACK_STRATEGIES:
            raise ValueError(f"unknown attack strategy {self.strategy!r}; valid choices: "
                             f"{sorted(ATTACK_STRATEGIES)}")
        return self

    @property
    def key(self) -> str:
        return self.label or f"{self.query}/{self.strategy}"


class EvalConfig(StrictModel):
    """``modelward extract run`` configuration (see examples/extraction_digits.toml)."""

    name: str = "extraction"
    data: DataConfig = Field(default_factory=DataConfig)
    victim: VictimConfig = Field(default_factory=VictimConfig)
    transfer: TransferConfig = Field(default_factory=TransferConfig)
    budget: int = Field(500, ge=1)
    substitute: SubstituteConfig = Field(default_factory=SubstituteConfig)
    substitute_model: ModelConfig | None = None  # None = the victim's architecture (the paper's assumption)
    defenses: list[DefenseSpec] = Field(default_factory=lambda: [DefenseSpec(name="none")])
    attacks: list[AttackSpec] = Field(default_factory=lambda: [AttackSpec()])
    seeds: list[int] = Field(default_factory=lambda: [0])
    centroid_epsilons: list[float] = Field(default_factory=list)  # ModelGuard-S growth curves (Fig. 5 right)
    threads: int = Field(1, ge=1)  # torch intra-op threads (small models run best single-threaded)

    @model_validator(mode="after")
    def _check(self) -> EvalConfig:
        if not self.defenses:
            raise ValueError("defenses: need at least one [[defenses]] entry")
        if not self.attacks:
            raise ValueError("attacks: need at least one [[attacks]] entry")
        if not self.seeds:
            raise ValueError("seeds: need at least one seed")
        labels = [a.key for a in self.attacks]
        if len(set(labels)) != len(labels):
            raise ValueError(f"attacks: duplicate rows {labels}; give repeated strategies distinct 'label's")
        for i, d in enumerate(self.defenses):
            bad = sorted(set(d.attacks) - set(labels))
            if bad:
                raise ValueError(f"defenses.{i}.attacks: unknown attack rows {bad}; valid: {labels}")
        keys = [(d.label or d.name, e) for d in self.defenses for e in (d.epsilons or [None])]
        if len(set(keys)) != len(keys):
            raise ValueError("defenses: two entries give the same column (label, ε); use distinct labels or ε")
        if self.victim.url and len(self.defenses) != 1:
            raise ValueError("victim.url: a remote victim runs one defense; list exactly that one in [[defenses]] "
                             "(the adaptive attacker's replica)")
        return self


@dataclass(frozen=True)
class Cell:
    defense: DefenseSpec
    epsilon: float | None
    attack: AttackSpec
    seed: int

    @property
    def defense_key(self) -> str:
        base = self.defense.label or self.defense.name
        return base if self.epsilon is None else f"{base}@{self.epsilon:g}"

    @property
    def run_id(self) -> str:
        return f"{self.defense_key}|{self.attack.key}|s{self.seed}"

    def spec(self) -> dict[str, Any]:
        return {"defense": self.defense.model_dump(mode="json"), "epsilon": self.epsilon,
                "attack": self.attack.model_dump(mode="json"), "seed": self.seed}


def cells(cfg: EvalConfig) -> list[Cell]:
    out = []
    for d in cfg.defenses:
        for eps in (d.epsilons or [None]):
            for a in cfg.attacks:
                if d.attacks and a.key not in d.attacks:
                    continue
                for s in cfg.seeds:
                    out.append(Cell(d, eps, a, s))
    return out


# ---------------------------------------------------------------------------------------------------------------
# victim and data
class Tempered(nn.Module):
    """Logits divided by a temperature T, so the served softmax is softmax(z / T) (a less confident victim)."""

    def __init__(self, model: nn.Module, temperature: float) -> None:
        super().__init__()
        self.model, self.temperature = model, float(temperature)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x) / self.temperature


@dataclass
class Prepared:
    """Everything the cells share: data split, trained victim, attacker pool, eval set."""

    data: DataSplit
    victim: nn.Module  # tempered
    victim_accuracy: float
    transfer: TransferSet
    eval_set: EvalSet
    substitute_factory: Callable[[], nn.Module]
    misinformation: nn.Module | None
    cached: bool
    model_cfg: ModelConfig


def _cfg_hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _split_victim(cfg: EvalConfig, data: DataSplit) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded permutation of the train split: the victim's indices and the attacker pool's indices."""
    n = len(data.x_train)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.victim.seed + 1))
    k = max(1, min(n - 1, int(round(n * cfg.victim.victim_fraction))))
    return perm[:k], perm[k:]


def _train_misinformation(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, seed: int) -> None:
    """AM's misinformation model f̂: minimise −log(1 − softmax(f̂(x))_y + 1e-7) (official ``train_admis``)."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.train()
    for _ in range(steps):
        idx = torch.randint(0, len(x), (min(64, len(x)),), generator=g)
        p = torch.softmax(model(x[idx]), 1).gather(1, y[idx, None]).squeeze(1)
        loss = -torch.log(1 - p + 1e-7).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()


def prepare(cfg: EvalConfig, console: Console | None = None) -> Prepared:
    """Load data, train (or load from cache) the victim, build the attacker pool and the eval set."""
    data = load_data(cfg.data)
    vidx, pidx = _split_victim(cfg, data)
    arch = cfg.victim.model
    key = _cfg_hash({"data": cfg.data.model_dump(mode="json"), "model": arch.model_dump(mode="json"),
                     "train": cfg.victim.train.model_dump(mode="json"), "frac": cfg.victim.victim_fraction,
                     "seed": cfg.victim.seed, "am": cfg.victim.misinformation_steps,
                     "am_needed": any(d.name == "adaptive_misinformation" for d in cfg.defenses)})
    cache = Path(cfg.victim.cache_dir).expanduser() / key

    def factory() -> nn.Module:
        return build_model(arch, data.input_shape, data.num_classes)

    base = seeded_model(factory, cfg.victim.seed)
    need_am = any(d.name == "adaptive_misinformation" for d in cfg.defenses)
    mis = seeded_model(factory, cfg.victim.seed + 5) if need_am else None
    cached = (cache / "victim.safetensors").is_file() and (not need_am or (cache / "misinfo.safetensors").is_file())
    if cached:
        state, _ = load_state_dict(cache / "victim.safetensors")
        base.load_state_dict(state)
        if mis is not None:
            mis.load_state_dict(load_state_dict(cache / "misinfo.safetensors")[0])
    else:
        if console:
            console.print(f"training the victim ({arch.arch}, {cfg.victim.train.steps} steps) …")
        train(base, data.x_train[vidx], data.y_train[vidx], data.x_test, data.y_test, cfg.victim.train,
              seed=cfg.victim.seed)
        save_state_dict(cache / "victim.safetensors", base.state_dict(), {"config": key})
        if mis is not None:
            _train_misinformation(mis, data.x_train[vidx], data.y_train[vidx], cfg.victim.misinformation_steps,
                                  cfg.victim.seed + 6)
            save_state_dict(cache / "misinfo.safetensors", mis.state_dict(), {"config": key})
    base.eval()
    victim = Tempered(base, cfg.victim.temperature).eval()
    with torch.no_grad():
        vlab = victim(data.x_test).argmax(1)
    vacc = (vlab == data.y_test).float().mean().item()
    transfer = _transfer(cfg, data, pidx)
    if cfg.budget > len(transfer):
        raise ConfigError(f"budget: {cfg.budget} exceeds the transfer pool ({len(transfer)} inputs); lower budget "
                          "or enlarge the pool (transfer.size / victim.victim_fraction)")
    sub_arch = cfg.substitute_model or arch
    return Prepared(data, victim, vacc, transfer, EvalSet(data.x_test, data.y_test, vlab),
                    lambda: build_model(sub_arch, data.input_shape, data.num_classes), mis, cached, arch)


def _transfer(cfg: EvalConfig, data: DataSplit, pidx: torch.Tensor) -> TransferSet:
    t = cfg.transfer
    if t.source == "pool":
        return TransferSet(data.x_train[pidx], data.y_train[pidx])
    if t.source == "noise":
        g = torch.Generator().manual_seed(t.seed)
        return TransferSet(torch.rand((t.size, *data.input_shape), generator=g))
    assert t.data is not None
    other = load_data(t.data)
    if other.input_shape != data.input_shape:
        raise ConfigError(f"transfer.data: inputs have shape {list(other.input_shape)}, the victim expects "
                          f"{list(data.input_shape)}")
    return TransferSet(other.x_train, other.y_train)


def build_defense(spec: DefenseSpec, epsilon: float | None, prep: Prepared, seed: int) -> PredictionDefense:
    """A fresh defense instance (stateful defenses start empty for every cell, as separate runs in the paper)."""
    params = dict(spec.params)
    if epsilon is not None:
        params["epsilon"] = epsilon
    if spec.name == "mad" and "surrogate" not in params:
        # MAD's G comes from a randomly initialised surrogate of the victim's architecture (digest §7)
        params["surrogate"] = seeded_model(prep.substitute_factory, 10_000 + seed).eval()
    if spec.name == "adaptive_misinformation" and "misinformation" not in params:
        params["misinformation"] = prep.misinformation
    return make_defense(spec.name, **params)


# ---------------------------------------------------------------------------------------------------------------
# one cell
class _Recording:
    """Wraps a remote victim and records the ℓ1 distortion of its answers when the clean model is known."""

    def __init__(self, inner: Any, clean: Callable[[torch.Tensor], torch.Tensor] | None) -> None:
        self.inner, self._clean = inner, clean
        self.max_l1, self._sum, self._n = 0.0, 0.0, 0

    @property
    def num_classes(self) -> int:
        return int(self.inner.num_classes)

    @property
    def queries_used(self) -> int:
        return int(self.inner.queries_used)

    @property
    def mean_l1(self) -> float:
        return self._sum / self._n if self._n else float("nan")

    def query(self, x: torch.Tensor) -> torch.Tensor:
        ans = self.inner.query(x)
        if self._clean is not None:
            d = (ans.double() - self._clean(x).double()).abs().sum(1)
            self.max_l1 = max(self.max_l1, float(d.max()) if len(d) else 0.0)
            self._sum += float(d.sum())
            self._n += len(d)
        return ans


def _clean_fn(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    @torch.no_grad()
    def clean(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.softmax(model(x[i : i + 512]), 1) for i in range(0, len(x), 512)])

    return clean


def centroid_count(defense: PredictionDefense) -> int | None:
    """Number of ModelGuard-S centroids (None for other defenses)."""
    n = getattr(defense, "num_centroids", None)
    if n is None:
        return None
    return int(n() if callable(n) else n)


def run_cell(cfg: EvalConfig, prep: Prepared, cell: Cell, workdir: Path) -> dict[str, Any]:
    """Run one defense × ε × attack × seed and return its metrics (JSON-serialisable)."""
    from modelward.extraction.victim import HttpVictim, LocalVictim

    t0 = time.perf_counter()
    defense = build_defense(cell.defense, cell.epsilon, prep, cell.seed)
    clean = _clean_fn(prep.victim)
    attack = make_attack(cell.attack.query, cell.attack.strategy, cell.attack.query_params,
                         cell.attack.strategy_params, cfg.substitute)
    server = None
    inner: Any = None
    try:
        if cfg.victim.url:
            if defense.stateful and ATTACK_STRATEGIES[cell.attack.strategy].needs_knowledge:
                raise ConfigError("victim.url: adaptive attacks against a stateful defense need the server's "
                                  "quantizer state, which a remote victim does not reveal; use a local victim")
            inner = HttpVictim(cfg.victim.url, cfg.victim.model_name, cfg.victim.api_key)
            victim: Any = _Recording(inner, None)
            knowledge = knowledge_from_defense(defense, None)
        elif cfg.victim.serve:
            server, inner = _serve(cfg, prep, cell, workdir)
            victim = _Recording(inner, clean)
            knowledge = knowledge_from_defense(defense, clean)
            if defense.stateful and ATTACK_STRATEGIES[cell.attack.strategy].needs_knowledge:
                raise ConfigError("victim.serve: adaptive attacks against a stateful defense need the server's "
                                  "quantizer state; run them with a local victim (victim.serve = false)")
        else:
            victim = LocalVictim(prep.victim, defense, num_classes=prep.data.num_classes)
            knowledge = knowledge_from_defense(defense, clean)
        result = attack.run(victim, prep.transfer, cfg.budget, prep.substitute_factory, seed=cell.seed,
                            eval_set=prep.eval_set, knowledge=knowledge)
        max_l1, mean_l1 = victim.max_l1, victim.mean_l1
        if cfg.victim.url:
            max_l1 = mean_l1 = float("nan")
            protected = _remote_accuracy(inner, prep)
        else:
            protected = protected_accuracy(cell, prep)
    finally:
        if inner is not None and hasattr(inner, "close"):
            inner.close()
        if server is not None:
            server.stop()
    out = result.to_dict()
    out.pop("curve")
    out.update({"max_l1": max_l1, "mean_l1": mean_l1, "protected_accuracy": protected,
                "centroids": None if (cfg.victim.url or cfg.victim.serve) else centroid_count(defense),
                "cell_seconds": time.perf_counter() - t0})
    return out


def protected_accuracy(cell: Cell, prep: Prepared) -> float:
    """Victim test accuracy through a fresh instance of the cell's defense (answers' top-1 vs true labels)."""
    defense = build_defense(cell.defense, cell.epsilon, prep, cell.seed)
    x, y = prep.eval_set.x, prep.eval_set.y
    clean = _clean_fn(prep.victim)(x)
    ans = defense.defend(clean, x) if defense.needs_inputs else defense.defend(clean)
    return (ans.argmax(1) == y).float().mean().item()


def _remote_accuracy(victim: Any, prep: Prepared) -> float:
    ans = torch.cat([victim.query(prep.eval_set.x[i : i + 256]) for i in range(0, len(prep.eval_set.x), 256)])
    return (ans.argmax(1) == prep.eval_set.y).float().mean().item()


def fold_temperature(victim: nn.Module) -> nn.Module:
    """A plain zoo model computing z / T: the temperature folded into the output Linear layer (for serving)."""
    from modelward.extraction.attacks.s4l import last_linear

    if not isinstance(victim, Tempered):
        return copy.deepcopy(victim)
    model = copy.deepcopy(victim.model)
    if victim.temperature != 1.0:
        lin = last_linear(model)
        with torch.no_grad():
            lin.weight.div_(victim.temperature)
            if lin.bias is not None:
                lin.bias.div_(victim.temperature)
    return model


def _serve(cfg: EvalConfig, prep: Prepared, cell: Cell, workdir: Path) -> tuple[Any, Any]:
    """Start the guarded HTTP service on 127.0.0.1 for this cell's defense and connect an HTTP victim."""
    from modelward.extraction.service_process import start_guard_server, write_guard_config
    from modelward.extraction.victim import HttpVictim

    if cell.defense.name in ("mad", "adaptive_misinformation"):
        raise ConfigError("victim.serve: MAD and AdaptiveMisinformation need model files on the server; "
                          "evaluate them with a local victim (victim.serve = false)")
    key = "modelward-eval-" + hashlib.sha256(cell.run_id.encode()).hexdigest()[:16]
    folder = workdir / "serve" / hashlib.sha256(cell.run_id.encode()).hexdigest()[:12]
    path = write_guard_config(folder, fold_temperature(prep.victim), prep.model_cfg, prep.data.input_shape,
                              prep.data.num_classes, defense=cell.defense.name, defense_params=_serve_params(cell),
                              keys={key: None}, name=cfg.victim.model_name)
    server = start_guard_server(path)
    try:
        return server, HttpVictim(server.url, server.model_name, key)
    except BaseException:
        server.stop()
        raise


def _serve_params(cell: Cell) -> dict[str, Any]:
    params = dict(cell.defense.params)
    if cell.epsilon is not None:
        params["epsilon"] = cell.epsilon
    return params


# ---------------------------------------------------------------------------------------------------------------
# the whole evaluation
COLUMNS = ["defense", "epsilon", "attack", "query", "strategy", "seed", "accuracy", "fidelity", "best_epoch",
           "max_l1", "mean_l1", "protected_accuracy", "recovery_distance", "queries_used", "n_train", "centroids",
           "cell_seconds"]


def run_evaluation(cfg: EvalConfig, out: Path, console: Console | None = None) -> dict[str, Any]:
    """Run every pending cell through the ledger and write the report files; returns a summary dict."""
    console = console or Console()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        ledger = RunLedger(out / "ledger.sqlite")
        ledger.check_meta("config", _cfg_hash(cfg.model_dump(mode="json", exclude={"threads"})))
        dump_config(cfg, out / "config.json")
        all_cells = cells(cfg)
        by_id = {c.run_id: c for c in all_cells}
        for c in all_cells:
            ledger.add(c.run_id, c.spec())
        ledger.recover()
        pending = [r for r in ledger.pending() if r in by_id]
        prep = prepare(cfg, console)
        console.print(f"victim: test accuracy {prep.victim_accuracy:.4f} "
                      f"({'cached' if prep.cached else 'trained'}), pool {len(prep.transfer)}, budget {cfg.budget}; "
                      f"{len(all_cells) - len(pending)}/{len(all_cells)} cells already done")
        with make_progress(console) as progress:
            task = progress.add_task("extraction", total=len(all_cells), completed=len(all_cells) - len(pending),
                                     info="")
            for run_id in pending:
                if not ledger.start(run_id):
                    continue
                progress.update(task, info=run_id)
                try:
                    res = run_cell(cfg, prep, by_id[run_id], out)
                except Exception as e:
                    ledger.fail(run_id, f"{type(e).__name__}: {e}")
                    raise
                ledger.finish(run_id, res)
                progress.update(task, advance=1, info=f"{run_id}: acc {res['accuracy']:.3f}")
        results = ledger.results()
        order = {c.run_id: i for i, c in enumerate(all_cells)}
        rows = [_row(by_id[r], res) for r, res in sorted(results.items(), key=lambda kv: order.get(kv[0], -1))
                if r in by_id]
        curves = centroid_curves(cfg, prep) if cfg.centroid_epsilons else {}
        summary = write_report(cfg, rows, prep, curves, out)
    finally:
        torch.set_num_threads(prev_threads)
    return summary


def _row(cell: Cell, res: dict[str, Any]) -> dict[str, Any]:
    row = {"defense": cell.defense_key, "epsilon": cell.epsilon, "attack": cell.attack.key,
           "query": cell.attack.query, "strategy": cell.attack.strategy, "seed": cell.seed}
    row.update({k: res.get(k) for k in COLUMNS if k not in row})
    return row


def centroid_curves(cfg: EvalConfig, prep: Prepared, every: int = 25) -> dict[str, tuple[list[int], list[int]]]:
    """ModelGuard-S centroid count vs number of queries (KnockoffNets order over the pool; Fig. 5 right)."""
    clean = _clean_fn(prep.victim)
    n = min(len(prep.transfer), max(cfg.budget, 1))
    idx = torch.randperm(len(prep.transfer), generator=torch.Generator().manual_seed(cfg.seeds[0]))[:n]
    y = clean(prep.transfer.x[idx])
    curves = {}
    for eps in cfg.centroid_epsilons:
        s = make_defense("modelguard_s", epsilon=eps)
        xs, cs = [0], [0]
        for i in range(0, n, every):
            s.defend(y[i : i + every])
            xs.append(min(i + every, n))
            cs.append(centroid_count(s) or 0)
        curves[f"ε={eps:g}"] = (xs, cs)
    return curves


def _mean(vals: list[float]) -> float:
    vals = [v for v in vals if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return sum(vals) / len(vals) if vals else float("nan")


def aggregate(rows: list[dict[str, Any]]) -> tuple[list[str], list[str], dict[tuple[str, str], dict[str, float]]]:
    """Mean over seeds per (attack, defense); returns (attack order, defense order, cell means)."""
    attacks = list(dict.fromkeys(r["attack"] for r in rows))
    defenses = list(dict.fromkeys(r["defense"] for r in rows))
    means: dict[tuple[str, str], dict[str, float]] = {}
    for a in attacks:
        for d in defenses:
            rs = [r for r in rows if r["attack"] == a and r["defense"] == d]
            if rs:
                means[(a, d)] = {k: _mean([r[k] for r in rs]) for k in
                                 ("accuracy", "fidelity", "max_l1", "protected_accuracy", "recovery_distance")}
                means[(a, d)]["n"] = len(rs)
                accs = [r["accuracy"] for r in rs]
                mu = means[(a, d)]["accuracy"]
                means[(a, d)]["accuracy_sd"] = (math.sqrt(sum((v - mu) ** 2 for v in accs) / (len(accs) - 1))
                                                if len(accs) > 1 else float("nan"))
    return attacks, defenses, means


def worst_case(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per defense: max over attacks of extraction accuracy and fidelity, max ℓ1, protected accuracy."""
    attacks, defenses, means = aggregate(rows)
    out = []
    for d in defenses:
        ms = {a: means[(a, d)] for a in attacks if (a, d) in means}
        best = max(ms, key=lambda a: ms[a]["accuracy"])
        out.append({"defense": d, "max_accuracy": ms[best]["accuracy"], "worst_attack": best,
                    "max_fidelity": max(m["fidelity"] for m in ms.values()),
                    "max_l1": max((m["max_l1"] for m in ms.values() if not math.isnan(m["max_l1"])),
                                  default=float("nan")),
                    "protected_accuracy": _mean([m["protected_accuracy"] for m in ms.values()]),
                    "attacks": len(ms)})
    return out


def _pct(v: float) -> str:
    return "—" if v is None or math.isnan(v) else f"{100 * v:.2f}%"


def _cell(m: dict[str, float]) -> str:
    """Mean accuracy, with ± the SD over seeds (n − 1) when there are several."""
    sd = m.get("accuracy_sd", float("nan"))
    return _pct(m["accuracy"]) + ("" if math.isnan(sd) else f" ± {100 * sd:.1f}")


def write_report(cfg: EvalConfig, rows: list[dict[str, Any]], prep: Prepared,
                 curves: dict[str, tuple[list[int], list[int]]], out: Path) -> dict[str, Any]:
    from modelward.core.plots import line_plot

    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    wc = worst_case(rows) if rows else []
    with open(out / "worst_case.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["defense", "max_accuracy", "worst_attack", "max_fidelity", "max_l1",
                                          "protected_accuracy", "attacks"])
        w.writeheader()
        w.writerows(wc)
    attacks, defenses, means = aggregate(rows) if rows else ([], [], {})
    md = [f"# {cfg.name}: extraction accuracy of the substitute", "",
          f"Victim: {cfg.data.source}, {cfg.victim.model.arch}, T = {cfg.victim.temperature:g}, test accuracy "
          f"{_pct(prep.victim_accuracy)}; transfer pool: {cfg.transfer.source} ({len(prep.transfer)}); budget "
          f"{cfg.budget}; seeds {cfg.seeds} (mean ± SD over seeds where there are several).", ""]
    md.append("| Attack | " + " | ".join(defenses) + " |")
    md.append("|---|" + "---|" * len(defenses))
    for a in attacks:
        md.append(f"| {a} | " + " | ".join(_cell(means[(a, d)]) if (a, d) in means else "—"
                                           for d in defenses) + " |")
    wcd = {r["defense"]: r for r in wc}
    md.append("| **Max accuracy of w_s** | " + " | ".join(f"**{_pct(wcd[d]['max_accuracy'])}**" for d in defenses)
              + " |")
    md.append("| Max fidelity of w_s | " + " | ".join(_pct(wcd[d]["max_fidelity"]) for d in defenses) + " |")
    md.append("| Max ℓ1 distortion | " + " | ".join(
        "—" if math.isnan(wcd[d]["max_l1"]) else f"{wcd[d]['max_l1']:.2f}" for d in defenses) + " |")
    md.append("| Protected accuracy of w_t | " + " | ".join(_pct(wcd[d]["protected_accuracy"]) for d in defenses)
              + " |")
    partial = [d for d in defenses if wcd[d]["attacks"] < len(attacks)]
    if partial:
        md += ["", f"Columns {', '.join(partial)} ran a subset of the attacks (— cells); their max is over that "
               "subset."]
    if any(not math.isnan(m["recovery_distance"]) for m in means.values()):
        md += ["", "Mean recovery distance E‖ỹ − y‖₂ (lower = the attacker recovered the clean answers better):", "",
               "| Attack | " + " | ".join(defenses) + " |", "|---|" + "---|" * len(defenses)]
        for a in attacks:
            md.append(f"| {a} | " + " | ".join(
                f"{means[(a, d)]['recovery_distance']:.3f}" if (a, d) in means
                and not math.isnan(means[(a, d)]["recovery_distance"]) else "—" for d in defenses) + " |")
    if curves:
        md += ["", "ModelGuard-S centroids after N queries: " + "; ".join(
            f"{k}: {v[1][-1]} after {v[0][-1]}" for k, v in curves.items())]
    (out / "results.md").write_text("\n".join(md) + "\n")

    # accuracy vs ε: one line per (defense, attack) with at least two ε values (across [[defenses]] entries)
    series: dict[str, tuple[list[float], list[float]]] = {}
    bases = list(dict.fromkeys(d.label or d.name for d in cfg.defenses))
    eps_of = {b: sorted({e for d in cfg.defenses if (d.label or d.name) == b for e in d.epsilons}) for b in bases}
    for base in bases:
        for a in attacks:
            pts = [(e, means[(a, f"{base}@{e:g}")]["accuracy"]) for e in eps_of[base]
                   if (a, f"{base}@{e:g}") in means]
            if len(pts) >= 2:
                series[f"{base} / {a}"] = ([p[0] for p in pts], [p[1] for p in pts])
    if series:
        line_plot(out / "accuracy_vs_epsilon.png", series, f"{cfg.name}: extraction accuracy vs ε", "ε (ℓ1 budget)",
                  "extraction accuracy")
    if curves:
        line_plot(out / "centroids_vs_queries.png", {k: (v[0], v[1]) for k, v in curves.items()},
                  f"{cfg.name}: ModelGuard-S centroids", "queries", "centroids")
        with open(out / "centroids.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["epsilon", "queries", "centroids"])
            for k, (xs, cs) in curves.items():
                for x, c in zip(xs, cs, strict=True):
                    w.writerow([k.split("=")[1], x, c])
    return {"cells": len(rows), "victim_accuracy": prep.victim_accuracy, "worst_case": wc,
            "outputs": sorted(p.name for p in out.iterdir() if p.is_file())}


def knowledge_for_local(defense: PredictionDefense, model: nn.Module) -> AttackKnowledge:
    """Convenience for library users: the adaptive attacker's knowledge of a local victim (model + defense)."""
    return knowledge_from_defense(defense, _clean_fn(model))

