"""Loopback split training of an in-memory model: certificates, party processes, driver, export, audit check.

Used by ``modelward demo`` (the trained model then goes into the completion study: how hard is it for one party to
complete the other's part?), by the benchmark and by the end-to-end tests.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from torch import nn

from modelward.core.config import to_toml
from modelward.core.data import DataSplit
from modelward.core.io import load_tensors, save_tensors
from modelward.core.progress import RichProgress
from modelward.core.train import TrainConfig
from modelward.governance.audit import AuditError, verify
from modelward.governance.driver import PartyRef, SplitConfig, SplitDriver
from modelward.governance.party.config import TLSConfig
from modelward.governance.plan import infer_model_config, make_plan, model_layers, segment_of
from modelward.governance.transport.launch import PartyProcess, start_parties, stop_parties
from modelward.governance.trust.certs import make_certs


@dataclass
class SplitDemoResult:
    state_dict: dict[str, torch.Tensor]  # the full trained model's parameters+buffers, names as in `model`
    curve: list[tuple[int, float]]  # (step, test loss) at 0, every eval_every steps and at the end
    party_params: dict[str, list[str]]  # party name -> the parameter names it holds
    summary: dict[str, float]  # bytes per link, seconds, steps, ...


@dataclass
class LocalSplit:
    """Configs for a split of `model` across local parties, written under one folder."""

    root: Path
    party_configs: dict[str, Path]  # chain order
    owners: dict[str, list[str]]
    tls: TLSConfig
    processes: dict[str, PartyProcess] = field(default_factory=dict)

    def start(self, names: list[str] | None = None) -> None:
        names = names or list(self.party_configs)
        self.processes.update(start_parties({n: self.party_configs[n] for n in names},
                                            {n: self.root / n / "server.log" for n in names}))

    def split_config(self, train_cfg: TrainConfig, seed: int, **kw: Any) -> SplitConfig:
        # a party without a server process here is hosted by the driver (its address is never dialled)
        return SplitConfig(parties=[PartyRef(name=n, address=self.processes[n].address if n in self.processes
                                             else "127.0.0.1:0",
                                             cert=str(self.root / f"certs/{n}.pem")) for n in self.party_configs],
                           tls=self.tls, train=train_cfg, seed=seed, out_dir=str(self.root / "driver"), **kw)

    def stop(self) -> None:
        stop_parties(list(self.processes.values()))


def prepare_local_split(root: Path, model: nn.Module, data: DataSplit, parties: list[str], cuts: list[str],
                        policy: dict[str, Any] | None = None, checkpoint_every: int = 10, threads: int = 0,
                        driver: str | None = None, policies: dict[str, dict[str, Any]] | None = None,
                        own_init: bool = True, extra: dict[str, dict[str, Any]] | None = None,
                        exact: bool = True) -> LocalSplit:
    """Write certificates, each party's own data file and one PARTY.toml per party (peers pinned by their
    certificate files, chain roles set).

    With ``own_init`` (default) each party starts from its own checkpoint file holding only its own entries of
    `model` — a test/demo harness acting for every organisation, so that the split run can be compared with a
    monolithic run of `model`. Without it each party draws its initial parameters from the OS CSPRNG.
    Port 0: each server picks a free port and prints it. The first party's identity is the driver's, unless
    `driver` names another (the control role, e.g. ``"operator"``: it gets a key of its own).

    The harness acts for every organisation, so its default policy (when `policy` is not given) lets the driver
    fetch predictions as probabilities; with `exact` (default) the label holder returns exact gradients
    (``label_protection.method = "none"``), exact metrics and training losses (``eval.noise`` and
    ``train_loss.noise`` 0 unless the policy sets them) and no party bounds its steps
    (``integrity.influence.enabled = false``), which a comparison with monolithic training needs. Pass
    ``exact=False`` and explicit `policies` to run the parties under their shipped defaults.
    """
    root = Path(root).resolve()  # PARTY.toml paths must not depend on the folder a party is started from
    root.mkdir(parents=True, exist_ok=True)
    plan = make_plan(model, parties, cuts)
    mcfg = infer_model_config(model)
    driver = driver or parties[0]
    # a driver of its own (the control role, e.g. "operator") gets its own key; a resumed demo keeps its certificates
    make_certs(root / "certs", [*parties, *([driver] if driver not in parties else [])], if_exists="reuse")
    pol = policy or {"allow_peers": sorted({driver, *parties[:-1]}), "training": True, "inference": True,
                     "predict": {"result_receiver": driver, "form": "probs"}}
    configs: dict[str, Path] = {}
    for i, p in enumerate(parties):
        prev = parties[i - 1] if i > 0 else None
        nxt = parties[i + 1] if i + 1 < len(parties) else None
        peers = {q: {"cert": str(root / f"certs/{q}.pem")} for q in {driver, *(x for x in (prev, nxt) if x)}
                 if q != p}
        mine = dict((policies or {}).get(p, pol))
        mine["allow_peers"] = [q for q in mine.get("allow_peers", []) if q in peers or q == driver]
        cfg: dict[str, Any] = {
            "name": p, "host": "127.0.0.1", "port": 0, "layers": plan.owners[p],
            "input_shape": list(data.x_train.shape[1:]), "num_classes": int(data.num_classes),
            "checkpoint_dir": str(root / p / "checkpoints"), "checkpoint_every": checkpoint_every,
            "audit_db": str(root / p / "audit.db"), "threads": threads,
            "model": mcfg.model_dump(mode="json", exclude_none=True),
            "policy": mine, "peers": peers, "driver": driver,
            "tls": {"ca": str(root / "certs/ca.pem"), "cert": str(root / f"certs/{p}.pem"),
                    "key": str(root / f"certs/{p}.key")},
        }
        if prev:
            cfg["prev"] = prev
        if nxt:
            cfg["next"] = nxt
        if own_init:
            init = root / p / "init.safetensors"
            save_tensors(init, dict(segment_of(model, plan.owners[p]).state_dict()))
            cfg["init"] = {"checkpoint": str(init)}
        cfg["model"].pop("kwargs", None)
        if exact and i == len(parties) - 1:
            cfg["label_protection"] = {"method": "none"}
            # exact metrics and training losses too (the label holder's release path adds no noise)
            for table in ("eval", "train_loss"):
                mine[table] = {**mine.get(table, {}), "noise": mine.get(table, {}).get("noise", 0.0)}
        if exact:  # (bounded influence scales some honest steps: a comparison with monolithic training turns it off)
            cfg["integrity"] = {"influence": {"enabled": False}}
        cfg.update((extra or {}).get(p, {}))
        own: dict[str, torch.Tensor] = {}
        if i == 0:
            own = {"x_train": data.x_train, "x_test": data.x_test}
        if i == len(parties) - 1:
            own = {"y_train": data.y_train, "y_test": data.y_test}
        if own:
            save_tensors(root / p / "data.safetensors", own)
            cfg["data"] = {"file": str(root / p / "data.safetensors")}
        path = root / f"party_{p}.toml"
        path.write_text(to_toml(cfg))
        configs[p] = path
    tls = TLSConfig(ca=str(root / "certs/ca.pem"), cert=str(root / f"certs/{driver}.pem"),
                    key=str(root / f"certs/{driver}.key"))
    return LocalSplit(root, configs, plan.owners, tls)


def run_split_demo(out_dir: Path, model: nn.Module, data: DataSplit, train_cfg: TrainConfig, seed: int,
                   console: Console, cut: str | None = None) -> SplitDemoResult:
    """Make certs in out_dir, start alice+bob party servers on 127.0.0.1 (subprocesses), split-train `model`
    (alice: the layers up to and including `cut`, default: the first part in model.part_names), collect the
    trained parameters (each party exports its checkpoint at the end), stop the servers, verify the audit logs.

    Args:
        out_dir: the demo folder (certificates, party configs, checkpoints, audit logs).
        model: the whole model to split (its layers in chain order).
        data: the :class:`~modelward.core.data.DataSplit` (alice gets the inputs, bob the labels).
        train_cfg: the training procedure; seed: the data order.
        console: a rich ``Console`` for status lines.
        cut: the last layer alice holds (default: the first part in ``model.part_names``).

    Returns:
        A :class:`SplitDemoResult`: the trained ``state_dict`` (names as in ``model``), the test-loss ``curve``,
        ``party_params`` (party -> parameter names) and a ``summary`` (bytes per link, seconds, steps).

    Example:
        >>> res = run_split_demo(Path("demo"), model, data, TrainConfig(steps=50), 0, Console())  # doctest: +SKIP
        >>> model.load_state_dict(res.state_dict)  # doctest: +SKIP
    """
    out_dir = Path(out_dir)
    names = [lay.name for lay in model_layers(model)]
    cut = cut or getattr(model, "part_names", names)[0]
    t0 = time.perf_counter()
    split = prepare_local_split(out_dir, model, data, ["alice", "bob"], [cut])
    console.print(f"split: alice holds {split.owners['alice']} and the inputs, bob holds {split.owners['bob']} "
                  "and the labels; mutual TLS on 127.0.0.1")
    try:
        split.start()
        scfg = split.split_config(train_cfg, seed)
        with SplitDriver(scfg) as drv, RichProgress(console) as progress:
            res = drv.train(progress, out_dir / "driver")
            exports = drv.checkpoint_all(export=True)
    finally:
        split.stop()
    state: dict[str, torch.Tensor] = {}
    party_params: dict[str, list[str]] = {}
    for p, meta in exports.items():
        sd = load_tensors(meta["export"])
        state.update(sd)
        party_params[p] = [n for n, _ in model.named_parameters() if n in sd]
    missing = set(model.state_dict()) - set(state)
    if missing:
        raise AuditError(f"exported checkpoints miss {sorted(missing)[:5]}")
    for p in split.party_configs:
        v = verify(out_dir / p / "audit.db", expect_head=None)
        if not v.ok:
            raise AuditError(f"audit log of {p}: {v}")
    summary: dict[str, float] = {"steps": float(res.steps_run), "seconds": time.perf_counter() - t0,
                                 "train_seconds": res.seconds, "resumes": float(res.resumes)}
    for link, s in res.links.items():
        summary[f"{link}.bytes_sent"] = float(s["sent"])
        summary[f"{link}.bytes_received"] = float(s["received"])
        summary[f"{link}.seconds"] = float(s["seconds"])
    (out_dir / "split_summary.json").write_text(json.dumps({**summary, "party_params": party_params}, indent=2))
    console.print(f"split training done: {res.steps_run} steps in {res.seconds:.1f}s; audit logs verified")
    return SplitDemoResult(state, res.curve, party_params, summary)
