"""Label-leakage audit over real party processes: Alice's own server records the gradients Bob sends her.

The in-process sweep (``governance.leakage.study``) computes exactly what the parties compute. This module checks
the deployed path as well: Bob runs the ordinary ``modelward party serve`` with his ``[label_protection]``. Alice
runs the same server with one addition, :class:`RecordingParty`, which keeps every gradient ``g`` that arrives from
the next party during a training step, together with the batch indices. That is exactly what Alice's process
legitimately receives, and what an honest-but-curious Alice would keep. After training, the auditor, who stands in
for both organisations, scores the recordings against the true labels with ``governance.leakage.attacks``.

Example:
    >>> row = audit_over_parties(cfg, "runs/leak", "marvell", 4.0, seed=0, positive=0)  # doctest: +SKIP
    >>> row["direction_auc"]  # doctest: +SKIP
    0.51
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from modelward.core.data import load_data
from modelward.core.io import load_tensors, save_tensors
from modelward.core.zoo import build_model
from modelward.errors import ModelwardError
from modelward.governance.demo import prepare_local_split
from modelward.governance.driver import run_training
from modelward.governance.leakage.attacks import LeakageMeter
from modelward.governance.party.config import load_party_config
from modelward.governance.party.machine import Party
from modelward.governance.plan import model_layers
from modelward.governance.transport import server
from modelward.governance.transport.launch import wait_ready


class RecordingParty(Party):
    """A first party that also keeps the gradient each training step brings back (the last attempt per step)."""

    record_to: Path | None = None  # set by ``main`` before the server builds the party
    flush_every: int = 10

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._received: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _next_call(self, msg, meta, tensors):  # type: ignore[no-untyped-def]
        reply = super()._next_call(msg, meta, tensors)
        if msg.op == "step" and "g" in reply.tensors and "idx" in tensors:
            self._received[int(msg.step)] = (tensors["idx"].detach().clone(), reply.tensors["g"].detach().clone())
            if len(self._received) % self.flush_every == 0:
                self._flush()
        return reply

    def _flush(self) -> None:
        if self.record_to is None or not self._received:
            return
        out: dict[str, torch.Tensor] = {}
        for step, (idx, g) in self._received.items():
            out[f"idx.{step}"] = idx
            out[f"g.{step}"] = g.float()
        save_tensors(self.record_to, out)

    def close(self) -> None:
        self._flush()
        super().close()


def read_recording(path: str | Path) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """``[(step, batch indices, received gradient)]`` in step order, from a :class:`RecordingParty` file."""
    t = load_tensors(path)
    steps = sorted(int(k.split(".", 1)[1]) for k in t if k.startswith("g."))
    return [(s, t[f"idx.{s}"], t[f"g.{s}"]) for s in steps]


def start_recording_party(config: Path, log: Path, record: Path, timeout: float = 90.0):  # -> PartyProcess
    """Start Alice's server with the recorder in a subprocess, the same way ``launch.start_party`` does."""
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "modelward.governance.leakage.parties", "serve", str(config), "--record",
           str(record)]
    with log.open("ab") as fh:
        start = fh.tell()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=dict(os.environ))
    return wait_ready(proc, config, log, start, timeout)


def audit_over_parties(cfg, out_dir: str | Path, method: str, scale: float, seed: int, positive: int) -> dict:
    """Train Alice | Bob as two real ``party serve`` processes (mutual TLS, 127.0.0.1). Bob protects with
    ``method``/``scale``. Score what Alice recorded.

    Args:
        cfg: a ``LeakageAuditConfig`` (data, model, cut, train).
        out_dir: folder for this run (certificates, configs, logs, audit logs, the recording).
        method: ``none`` | ``isotropic`` | ``marvell`` (Bob's ``[label_protection]``).
        scale: its noise scale.
        seed: the data order (the parties draw their own parameters and noise from the OS CSPRNG).
        positive: binary only: the class the attacker calls positive.
    Returns:
        ``test_accuracy`` (from the driver's final evaluation), the attack AUCs (as in ``simulate_split``) and
        ``steps_recorded``.
    """
    root = Path(out_dir)
    data = load_data(cfg.data)
    model = build_model(cfg.model, data.input_shape, data.num_classes)  # structure only: parties draw their own
    cut = cfg.cut or model_layers(model)[0].name
    extra: dict[str, dict[str, Any]] = {}
    if method != "none" and scale > 0:
        extra["bob"] = {"label_protection": {"method": method, "scale": float(scale)}}
    comp = cfg.compression
    if comp.activations.method != "none":  # what crosses the cut compressed (the parties' [compression])
        extra.setdefault("alice", {})["compression"] = {"activations": comp.activations.model_dump(mode="json")}
    if comp.gradients.method != "none":
        extra.setdefault("bob", {})["compression"] = {"gradients": comp.gradients.model_dump(mode="json")}
    split = prepare_local_split(root, model, data, ["alice", "bob"], [cut], own_init=False, threads=1, extra=extra)
    record = root / "alice" / "received.safetensors"
    train_cfg = cfg.train.model_copy(update={"loss": "error", "eval_every": cfg.train.steps})
    t0 = time.perf_counter()
    try:
        split.start(["bob"])
        split.processes["alice"] = start_recording_party(split.party_configs["alice"], root / "alice" / "server.log",
                                                         record)
        res = run_training(split.split_config(train_cfg, seed, retry_s=0.0, timeout_s=120.0))
    finally:
        split.stop()
    if not record.is_file():
        raise ModelwardError(f"alice's recorder wrote nothing ({record}); see {root / 'alice' / 'server.log'}")
    meter = LeakageMeter(data.num_classes, positive, seed)
    received = read_recording(record)
    for step, idx, g in received:
        meter.update(g, data.y_train[idx], step, idx)  # the auditor holds the labels; Alice never did
    return {"test_accuracy": 1.0 - float(res.curve[-1][1]), **meter.summary(), "steps_recorded": len(received),
            "seconds": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> None:
    """``python -m modelward.governance.leakage.parties serve PARTY.toml --record FILE``: Alice's recording
    server (for the audit only)."""
    ap = argparse.ArgumentParser(prog="modelward.governance.leakage.parties")
    ap.add_argument("command", choices=["serve"])
    ap.add_argument("config")
    ap.add_argument("--record", required=True, help="safetensors file for the received gradients")
    args = ap.parse_args(argv)
    cfg = load_party_config(args.config)
    RecordingParty.record_to = Path(args.record)
    try:
        server.serve(cfg, log=lambda s: print(s, flush=True), party_type=RecordingParty)
    except ModelwardError as e:
        print(f"error: {e}", flush=True)
        sys.stdout.flush()
        os._exit(2)
    sys.stdout.flush()
    os._exit(0)  # as `party serve`: state saved, skip the slow teardown of torch/grpc threads


if __name__ == "__main__":
    main()
