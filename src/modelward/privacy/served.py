"""Privacy audit through the served prediction API: membership and extraction attacks against a live
``modelward guard serve`` over HTTP (KServe v2 / Open Inference Protocol), once per defense.

The owner trains the target on a known member set (the audit's split, as :mod:`.audit` does), then for each
configured defense writes a guard config derived from the user's GUARD.toml (its ``[server]`` and ``[model]``
settings, the new checkpoint, that defense, and an unlimited audit key), starts ``modelward guard serve`` on
127.0.0.1 (a free port), and attacks it **only over HTTP** through :class:`modelward.extraction.victim.HttpVictim`:

* ``loss`` — the loss-threshold attack (Yeom et al. 2018) on the *served* probabilities: score = log p̃_y;
* ``boundary`` / ``augmentation`` — the label-only attacks (:mod:`.membership.label_only`) on the served top-1;
* ``knockoff`` — KnockoffNets (Orekondy et al. 2019, :mod:`modelward.extraction.attacks`): a substitute trained
  on ``extraction_budget`` served answers to hold-out inputs; its test accuracy.

Each membership attack is scored on ``eval_points`` members and as many non-members (TPR at 1 % FPR, AUC, the
Clopper–Pearson ε lower bound); the served top-1 accuracy on the test split shows what the defense costs.
Outputs: ``results.csv/md/json`` (one row per defense × attack), ``table.md`` (defense × attack, TPR at 1 % FPR
and KnockoffNets accuracy), the score arrays, and each server's log.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import Field, model_validator

from modelward.core.config import AlgorithmSpec, StrictModel, dump_config, read_toml, to_toml
from modelward.core.data import DataConfig, load_data
from modelward.core.io import save_state_dict
from modelward.core.ports import free_port
from modelward.core.progress import ProgressSink
from modelward.core.records import atomic_write_text, write_table
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError, ModelwardError
from modelward.extraction.attacks import EvalSet, SubstituteConfig, TransferSet, make_extraction_attack
from modelward.extraction.defenses import DEFENSES
from modelward.extraction.victim import HttpVictim
from modelward.privacy import metrics
from modelward.privacy.membership.base import AttackData
from modelward.privacy.membership.label_only import AugmentationAttack, BoundaryDistanceAttack
from modelward.privacy.protocol import membership_split
from modelward.privacy.shadows import ModelTrainer

MEMBERSHIP = ("loss", "boundary", "augmentation")


class ServedDefense(AlgorithmSpec):
    """One defense of the guard (``name`` in ``modelward.extraction.defenses.DEFENSES``, ``params``, ``label``)."""

    @model_validator(mode="after")
    def _known(self) -> ServedDefense:
        if self.name not in DEFENSES:
            raise ValueError(f"unknown defense {self.name!r}; valid choices: {DEFENSES.names()}")
        return self


def _default_defenses() -> list[ServedDefense]:
    return [ServedDefense(name=n, params=p) for n, p in (
        ("none", {}), ("rounding", {"decimals": 1}), ("top1", {}), ("reverse_sigmoid", {}),
        ("mad", {"epsilon": 1.0}), ("modelguard_w", {"epsilon": 1.0}), ("modelguard_s", {"epsilon": 1.0}))]


class ServedAuditConfig(StrictModel):
    """Audit through the served API (see examples/privacy_served_digits.toml).

    Args:
        name / seed: the study's name and seed.
        data / model / train: the target's data, architecture (written into the guard's ``[model.net]``) and
            training; init: its initialiser.
        members / nonmembers: shares of the pooled data (the rest: the attacker's hold-out and transfer set).
        eval_points: members (and as many non-members) each membership attack scores.
        defenses: the defenses to serve, one server each.
        attacks: which of ``loss``, ``boundary``, ``augmentation``, ``knockoff`` to run;
            boundary / augmentation: their parameters.
        extraction_budget / extraction_epochs: KnockoffNets' distinct queries and substitute epochs.
        server_timeout: seconds to wait for a server to become ready.

    Returns:
        A strict config for :func:`run_served_audit`.

    Example:
        >>> [d.name for d in ServedAuditConfig().defenses][:3]
        ['none', 'rounding', 'top1']
    """

    name: str = "served-audit"
    seed: int = 0
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=lambda: ModelConfig(arch="mlp", hidden=[128]))
    train: TrainConfig = Field(default_factory=lambda: TrainConfig(lr=0.1, batch_size=32, steps=1500))
    init: str = "glorot_uniform"
    members: float = Field(0.25, gt=0.0, lt=1.0)
    nonmembers: float = Field(0.25, gt=0.0, lt=1.0)
    eval_points: int = Field(200, ge=10)
    defenses: list[ServedDefense] = Field(default_factory=_default_defenses)
    attacks: list[str] = Field(default_factory=lambda: ["loss", "boundary", "augmentation", "knockoff"])
    boundary: dict[str, Any] = Field(default_factory=lambda: {"iterations": 2, "grad_queries": 20,
                                                              "binary_steps": 8})
    augmentation: dict[str, Any] = Field(default_factory=lambda: {"samples": 16})
    extraction_budget: int = Field(500, ge=10)
    extraction_epochs: int = Field(10, ge=1)
    server_timeout: float = Field(120.0, gt=0.0)

    @model_validator(mode="after")
    def _check(self) -> ServedAuditConfig:
        bad = sorted(set(self.attacks) - {*MEMBERSHIP, "knockoff"})
        if bad:
            raise ValueError(f"attacks: unknown {bad}; valid choices: {[*MEMBERSHIP, 'knockoff']}")
        if self.members + self.nonmembers >= 1:
            raise ValueError("members + nonmembers must be < 1 (the rest is the attacker's hold-out)")
        keys = [d.key for d in self.defenses]
        if len(set(keys)) != len(keys) or not keys:
            raise ValueError("defenses: list at least one, with distinct labels")
        return self


def _free_port() -> int:
    return free_port()  # outside the ephemeral range: no outgoing connection takes it before the server binds it


class _Server:
    """``modelward guard serve CONFIG`` in a subprocess on 127.0.0.1 (the CLI, nothing imported from the
    service); stopped with SIGTERM (then killed) on exit."""

    def __init__(self, config: Path, timeout: float) -> None:
        import httpx

        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = config.with_suffix(".log")
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        with self.log.open("wb") as fh:
            self.proc = subprocess.Popen(  # noqa: S603 - our own CLI with a config we wrote
                [sys.executable, "-m", "modelward.cli.main", "guard", "serve", str(config), "--host", "127.0.0.1",
                 "--port", str(self.port)], stdout=fh, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ModelwardError(f"guard serve exited with code {self.proc.returncode}: "
                                     f"{self.log.read_text(errors='replace')[-1500:]}")
            try:
                if httpx.get(f"{self.url}/v2/health/ready", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise ModelwardError(f"guard serve did not become ready within {timeout:.0f} s (log: {self.log})")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def __enter__(self) -> _Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def guard_config_for(guard: dict[str, Any], directory: Path, checkpoint: Path, model: ModelConfig,
                     shape: tuple[int, ...], classes: int, defense: ServedDefense, key: str) -> Path:
    """The user's GUARD.toml with this audit's checkpoint, architecture, one defense and an unlimited audit key
    (the user's keys and budgets are left out: the audit must not spend them); state in ``directory``."""
    # (an [upstream] is left out too: the audit serves its own checkpoint in direct mode)
    cfg = {k: v for k, v in guard.items() if k not in ("keys", "defense", "model", "upstream")}
    server = dict(cfg.get("server", {}))
    server |= {"host": "127.0.0.1", "state_dir": str(directory / "state")}
    server.pop("port", None)
    cfg["server"] = server
    name = str(guard.get("model", {}).get("name", "model"))
    cfg["model"] = {"name": name, "checkpoint": str(checkpoint), "input_shape": list(shape),
                    "num_classes": int(classes), "net": model.model_dump(exclude_none=True)}
    cfg["defense"] = {"name": defense.name, "params": dict(defense.params)}
    cfg["keys"] = [{"name": "privacy-audit", "key": key}]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "guard.toml"
    path.write_text(to_toml(cfg), encoding="utf-8")
    return path


def _membership(cfg: ServedAuditConfig, name: str, victim: Any, sp: Any, xe: torch.Tensor, ye: torch.Tensor,
                members: np.ndarray) -> tuple[np.ndarray, float, int]:
    """(scores, threshold, queries) of one membership attack, through the victim's HTTP answers only."""
    q0 = victim.queries_used
    n_aux = min(len(sp.x_aux), cfg.eval_points)
    xa, ya = sp.x_aux[:n_aux], sp.y_aux[:n_aux]
    if name == "loss":
        def logp(x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
            p = victim.query(x).clamp_min(1e-12)
            return torch.log(p.gather(1, y[:, None]).squeeze(1)).double().numpy()

        thr = float(np.median(logp(xa, ya)))
        return logp(xe, ye), thr, victim.queries_used - q0

    def api(x: torch.Tensor) -> torch.Tensor:
        return victim.query(x).argmax(1)

    cls = BoundaryDistanceAttack if name == "boundary" else AugmentationAttack
    params = cfg.boundary if name == "boundary" else cfg.augmentation
    attack = cls(api=api, seed=cfg.seed, **params)
    attack.fit(AttackData(torch.nn.Identity(), xa, ya, int(ya.max()) + 1))
    scores = attack.score(xe, ye)
    return scores, attack.threshold, victim.queries_used - q0


def run_served_audit(cfg: ServedAuditConfig, guard_toml: str | Path, out_dir: str | Path,
                     progress: ProgressSink | None = None) -> list[dict[str, Any]]:
    """Serve the target behind each defense and attack it over HTTP; write the tables.

    Args:
        cfg: :class:`ServedAuditConfig`; guard_toml: the user's GUARD.toml (its ``[server]`` settings are kept);
        out_dir: the output folder; progress: one unit per defense.

    Returns:
        one row per defense × attack (defense, attack, tpr_at_1pct_fpr, auc, epsilon_lb, accuracy for
        knockoff, served_accuracy, queries, seconds).

    Example:
        >>> rows = run_served_audit(ServedAuditConfig(), "examples/guard_modelguard_w.toml", "served")  # doctest: +SKIP
    """
    guard = read_toml(Path(guard_toml))
    if not isinstance(guard, dict) or "server" not in guard:
        raise ConfigError(f"{guard_toml}: not a GUARD.toml (no [server] table)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, out / "config.json")
    d = load_data(cfg.data)
    x, y = torch.cat([d.x_train, d.x_test]), torch.cat([d.y_train, d.y_test])
    sp = membership_split(x, y, cfg.seed, cfg.members, cfg.nonmembers)
    shape, classes = tuple(d.input_shape), d.num_classes

    def factory() -> torch.nn.Module:
        return build_model(cfg.model, shape, classes)

    target = ModelTrainer(factory, cfg.train, cfg.init).train(sp.x_in, sp.y_in, cfg.seed).eval()
    checkpoint = out / "target.safetensors"
    save_state_dict(checkpoint, target.state_dict(), {"arch": cfg.model.model_dump()})
    n = min(cfg.eval_points, len(sp.x_in), len(sp.x_out))
    xe, ye = torch.cat([sp.x_in[:n], sp.x_out[:n]]), torch.cat([sp.y_in[:n], sp.y_out[:n]])
    members = np.r_[np.ones(n, bool), np.zeros(n, bool)]
    n_aux = min(len(sp.x_aux), cfg.eval_points)
    transfer = sp.x_aux[n_aux:]  # the attacker's other public data: KnockoffNets' transfer set
    with torch.no_grad():
        clean_test = target(sp.x_out[n:]).argmax(1) if len(sp.x_out) > n else target(sp.x_out).argmax(1)
    x_test = sp.x_out[n:] if len(sp.x_out) > n else sp.x_out
    y_test = sp.y_out[n:] if len(sp.y_out) > n else sp.y_out
    key = secrets.token_urlsafe(16)
    rows: list[dict[str, Any]] = []
    if progress:
        progress.start("served", len(cfg.defenses), "served privacy audit")
    for defense in cfg.defenses:
        folder = out / "guards" / defense.key
        path = guard_config_for(guard, folder, checkpoint.resolve(), cfg.model, shape, classes, defense, key)
        with _Server(path, cfg.server_timeout) as server, HttpVictim(server.url, guard.get("model", {}).get(
                "name", "model"), api_key=key) as victim:
            served = float((victim.query(x_test).argmax(1) == y_test).float().mean())
            base = {"defense": defense.key, "served_accuracy": served}
            for name in cfg.attacks:
                t0 = time.perf_counter()
                if name == "knockoff":
                    q0 = victim.queries_used
                    attack = make_extraction_attack("knockoff", "naive",
                                                    substitute=SubstituteConfig(epochs=cfg.extraction_epochs))
                    res = attack.run(victim, TransferSet(transfer), min(cfg.extraction_budget, len(transfer)),
                                     factory, seed=cfg.seed, eval_set=EvalSet(x_test, y_test, clean_test))
                    rows.append(base | {"attack": "knockoff", "accuracy": res.accuracy, "fidelity": res.fidelity,
                                        "queries": victim.queries_used - q0,
                                        "seconds": time.perf_counter() - t0})
                    continue
                scores, thr, queries = _membership(cfg, name, victim, sp, xe, ye, members)
                m = metrics.evaluate(scores, members, thr)
                metrics.save_scores(out / "scores", f"{defense.key}_{name}", scores, members, threshold=thr)
                rows.append(base | {"attack": name, "tpr_at_1pct_fpr": m.tpr_at_1pct_fpr, "auc": m.auc,
                                    "epsilon_lb": m.epsilon_lb, "advantage": m.advantage, "queries": queries,
                                    "seconds": time.perf_counter() - t0})
        if progress:
            progress.advance("served", 1, defense.key)
    if progress:
        progress.done("served")
    _write(cfg, out, rows)
    return rows


COLUMNS = ["defense", "attack", "tpr_at_1pct_fpr", "auc", "epsilon_lb", "advantage", "accuracy", "fidelity",
           "served_accuracy", "queries", "seconds"]


def pivot(rows: list[dict[str, Any]], attacks: list[str]) -> str:
    """The defense × attack Markdown table: TPR at 1 % FPR (and ε_lb) per membership attack, KnockoffNets
    extraction accuracy, the served top-1 accuracy."""
    head = ["defense", "served acc."] + [f"{a} TPR@1%FPR (ε_lb)" if a != "knockoff" else "KnockoffNets acc."
                                          for a in attacks]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for defense in dict.fromkeys(r["defense"] for r in rows):
        cells = [defense]
        by = {r["attack"]: r for r in rows if r["defense"] == defense}
        cells.append(f"{next(iter(by.values()))['served_accuracy']:.3f}")
        for a in attacks:
            r = by.get(a)
            if r is None:
                cells.append("—")
            elif a == "knockoff":
                cells.append(f"{r['accuracy']:.3f}")
            else:
                cells.append(f"{r['tpr_at_1pct_fpr']:.3f} ({r['epsilon_lb']:.2f})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _write(cfg: ServedAuditConfig, out: Path, rows: list[dict[str, Any]]) -> None:
    notes = [f"{cfg.eval_points} members and as many non-members per membership attack, queried over HTTP "
             "(guard serve, one server per defense); ε_lb: Clopper–Pearson ε lower bound (95 %, δ = 0)",
             "loss: log p̃_y of the served probabilities; boundary / augmentation: label-only on the served top-1; "
             f"knockoff: KnockoffNets substitute on {cfg.extraction_budget} served answers, test accuracy"]
    write_table(out, "results", rows, COLUMNS, title=f"{cfg.name}: attacks through the served API", notes=notes)
    atomic_write_text(out / "table.md", f"# {cfg.name}: defense × attack through the served API\n\n"
                      + pivot(rows, cfg.attacks) + "\n" + "\n".join(notes) + "\n")
