"""``modelward split audit-extraction CONFIG``: the neighbour attacks against real party processes under their real
policies (issue 26 item 3).

The run, all on 127.0.0.1 with mutual TLS:

1. Alice (the data owner, first part) and Bob (the rest, the labels) start as two ``party serve`` processes, with
   Bob's policy from the config (by default the shipped ``examples/policy_bob.toml``) and his PARTY.toml defaults
   (label protection, integrity). Alice's server records every gradient she receives
   (:class:`~modelward.governance.leakage.parties.RecordingParty`: what an honest-but-curious Alice keeps).
2. The driver — a control identity of its own, ``operator`` — trains the split as ``split train`` does.
3. Alice turns hostile. With her *data* key she sends Bob ``predict`` and ``eval`` passes on activations of her
   choosing; with the *control* key of her organisation she tries to fetch the answers. Every attack of
   :mod:`~modelward.governance.neighbour_audit` runs until Bob refuses.
4. The auditor, who stands in for both organisations, scores: agreement of each surrogate with Bob's real part on
   held-out activations, labels recovered from answers and from the recorded gradients, and the labelled rows a
   completion from scratch needs to reach the best agreement seen (the MC-hardness threat model, in rows).

Writes ``extraction.csv`` (part, attack, rows, agreement, refused, chance, note), ``extraction.json`` and
``extraction.png`` under ``--out``.

Example:
    >>> cfg = load_extraction_config("examples/audit_extraction_digits.toml")  # doctest: +SKIP
    >>> summary = run_extraction_audit(cfg, "runs/audit_extraction")  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import secrets
import time
from pathlib import Path
from typing import Any

import torch
from pydantic import Field

from modelward.core.config import StrictModel, load_config
from modelward.core.data import DataConfig, load_data
from modelward.core.io import load_into, load_tensors
from modelward.core.progress import ProgressSink
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ModelwardError
from modelward.governance.consent import Policy
from modelward.governance.neighbour_audit import (
    Point,
    Victim,
    completion_rows,
    eval_oracle_curve,
    gradient_label_recovery,
    labels_from_answers,
    query_pool,
    surrogate_curve,
    write_extraction,
)
from modelward.governance.protocol import ConsentDenied

log = logging.getLogger(__name__)


class AttackSettings(StrictModel):
    """``[attacks]``: which attacks, and the rows at which each curve is measured."""

    predict_pools: list[str] = Field(default_factory=lambda: ["natural", "augmented", "synthetic"])
    checkpoints: list[int] = Field(default_factory=lambda: [64, 256, 1024, 4096])
    chunk: int = Field(64, ge=1)  # rows per predict pass
    eval_points: list[int] = Field(default_factory=lambda: [1600, 8000])  # rows of the eval oracle (80 per point)
    labels_rows: int = Field(256, ge=1)
    gradient_labels: bool = True
    fit_steps: int = Field(300, ge=1)


class ExtractionAuditConfig(StrictModel):
    """The TOML of ``modelward split audit-extraction``.

    Args:
        data / model / cut / train: the split (Alice holds the layers up to ``cut``).
        policy_file: Bob's policy (relative to the config file; default: his shipped defaults, the flow tables
            included); party: extra PARTY.toml keys for Bob (e.g. ``label_protection``).
        attacks: :class:`AttackSettings`.
        seed: the data order and the attacks' randomness (parties draw their own parameters).

    Example:
        >>> ExtractionAuditConfig().attacks.checkpoints
        [64, 256, 1024, 4096]
    """

    data: DataConfig = Field(default_factory=lambda: DataConfig(source="digits"))
    model: ModelConfig = Field(default_factory=lambda: ModelConfig(arch="cnn", channels=[16, 32], fc=64))
    cut: str = "conv1"
    train: TrainConfig = Field(default_factory=lambda: TrainConfig(lr=0.05, momentum=0.9, batch_size=64,
                                                                   steps=200, eval_every=200, loss="error"))
    policy_file: str | None = None
    party: dict[str, Any] = Field(default_factory=dict)
    attacks: AttackSettings = Field(default_factory=AttackSettings)
    seed: int = 0


def load_extraction_config(path: str | Path, overrides: list[str] | None = None) -> ExtractionAuditConfig:
    cfg = load_config(path, ExtractionAuditConfig, overrides)
    if cfg.policy_file is not None:
        p = Path(cfg.policy_file)
        cfg.policy_file = str(p if p.is_absolute() else (Path(path).resolve().parent / p).resolve())
    return cfg


class PartyOracle:
    """Alice's hostile passes on Bob, over mutual TLS: ``predict``/``eval`` with her data key, ``fetch`` with her
    organisation's control key (the operator's)."""

    def __init__(self, bob_address: str, data_tls, control_tls, bob_pin: str, timeout: float = 30.0) -> None:
        # lazy: the gRPC client (grpc, cryptography) loads when the oracle connects, not with the config
        from modelward.governance.transport.client import GrpcPartyClient
        from modelward.governance.wire import Message

        self._msg = Message
        self.data = GrpcPartyClient("bob", bob_address, data_tls, bob_pin, timeout=timeout)
        self.control = GrpcPartyClient("bob", bob_address, control_tls, bob_pin, timeout=timeout)
        self.session = "extract-" + secrets.token_hex(4)
        self.seq = int(self.data.call(self._msg("open", self.session)).meta["last_seq"])

    def _data(self, op: str, meta: dict, tensors: dict) -> Any:
        self.seq += 1
        try:
            return self.data.call(self._msg(op, self.session, 0, self.seq, meta, tensors))
        except ModelwardError:
            self.seq -= 1  # a refused request never advances the sequence (wire.SequenceGuard)
            raise

    def predict(self, h: torch.Tensor, split: str = "test", idx: torch.Tensor | None = None) -> dict:
        idx = torch.arange(len(h)) if idx is None else idx
        r = self._data("predict", {"split": split}, {"h": h.contiguous(), "idx": idx})
        token = r.meta.get("token")
        if not token:

            raise ConsentDenied(f"bob keeps his outputs ({r.meta.get('kept', 'in his own folder')})")
        return dict(self.control.call(self._msg("fetch", self.session, meta={"token": token})).tensors)

    def eval_sum(self, h: torch.Tensor, idx: torch.Tensor, split: str, metric: str) -> float:
        return float(self._data("eval", {"split": split, "metric": metric}, {"h": h.contiguous(), "idx": idx})
                     .meta["sum"])

    def close(self) -> None:
        self.data.close()
        self.control.close()


def run_extraction_audit(cfg: ExtractionAuditConfig, out_dir: str | Path,
                         progress: ProgressSink | None = None) -> dict[str, Any]:
    """Run the audit (module docstring). Returns the summary written to ``extraction.json``."""
    # lazy: the driver, the party processes and gRPC load when the audit runs, not with load_extraction_config
    from modelward.governance.demo import prepare_local_split
    from modelward.governance.driver import SplitDriver
    from modelward.governance.leakage.parties import read_recording, start_recording_party
    from modelward.governance.party.config import TLSConfig
    from modelward.governance.plan import segment_of

    t0 = time.perf_counter()
    out = Path(out_dir)
    root = out / "parties"
    data = load_data(cfg.data)
    model = build_model(cfg.model, data.input_shape, data.num_classes)
    policy = load_config(cfg.policy_file, Policy).model_dump(mode="json") if cfg.policy_file else {
        "training": True, "inference": True, "min_batch": 8}
    policy["allow_peers"] = ["alice", "operator"]
    policy.setdefault("training", True)
    split = prepare_local_split(root, model, data, ["alice", "bob"], [cfg.cut], own_init=False, threads=1, exact=False,
                                driver="operator", policies={"bob": policy, "alice": {
                                    "allow_peers": ["operator"], "training": True, "inference": True}},
                                extra={"bob": dict(cfg.party)})
    record = root / "alice" / "received.safetensors"
    tc = cfg.train.model_copy(update={"eval_every": cfg.train.steps})

    phase: list[str] = []

    def note(msg: str) -> None:
        """One phase of the audit: in the log, and as a step of `progress`."""
        log.info("audit-extraction: %s", msg)
        if progress is not None:
            if phase:
                progress.done(phase[-1])
            phase.append(f"phase{len(phase)}")
            progress.start(phase[-1], None, msg)

    try:
        split.start(["bob"])
        split.processes["alice"] = start_recording_party(split.party_configs["alice"],
                                                         root / "alice" / "server.log", record)
        note("training the split (operator drives; alice records the gradients she receives)")
        with SplitDriver(split.split_config(tc, cfg.seed, retry_s=0.0, timeout_s=120.0)) as drv:
            res = drv.train()
            exports = drv.checkpoint_all(export=True)
        accuracy = 1.0 - float(res.curve[-1][1])
        state = {k: v for m in exports.values() for k, v in load_tensors(m["export"]).items()}
        full = build_model(cfg.model, data.input_shape, data.num_classes)
        load_into(full, state, "the parties' exported checkpoints")
        full.eval()
        bob_layers = split.owners["bob"]
        alice_part, bob_part = segment_of(full, split.owners["alice"]), segment_of(full, bob_layers)
        with torch.no_grad():
            h_train, h_test = alice_part(data.x_train), alice_part(data.x_test)

        def fresh() -> torch.nn.Module:
            m = build_model(cfg.model, data.input_shape, data.num_classes)
            return segment_of(m, bob_layers)

        victim = Victim(f"bob ({','.join(bob_layers)})", bob_part, fresh, data.num_classes)
        tls = {n: TLSConfig(ca=str(root / "certs/ca.pem"), cert=str(root / f"certs/{n}.pem"),
                            key=str(root / f"certs/{n}.key")) for n in ("alice", "operator")}
        ref = split.split_config(tc, cfg.seed).parties[1]
        oracle = PartyOracle(split.processes["bob"].address, tls["alice"], tls["operator"], ref.pin())
        points: list[Point] = []
        a = cfg.attacks
        try:
            for pool in a.predict_pools:
                note(f"predict surrogate from {pool} activations")
                queries = query_pool(pool, h_train, max(a.checkpoints), cfg.seed)
                points += surrogate_curve(oracle, victim, queries, h_test, a.checkpoints, f"predict_{pool}",
                                          a.chunk, a.fit_steps, cfg.seed)
            if a.eval_points:
                note("duplicate-index eval oracle")
                known = {}
                for c in range(data.num_classes):
                    hit = (data.y_test == c).nonzero()
                    if len(hit):
                        known[c] = int(hit[0])
                queries = query_pool("natural", h_train, max(a.eval_points) // (8 * data.num_classes) + 1, cfg.seed)
                points += eval_oracle_curve(oracle, victim, queries, h_test, known, a.eval_points,
                                            fit_steps=a.fit_steps, seed=cfg.seed)
            note("labels from predict answers on the training split")
            points.append(labels_from_answers(oracle, h_train, data.y_train, a.labels_rows, victim.part, a.chunk))
        finally:
            oracle.close()
    finally:
        split.stop()
    grad_labels: dict[str, float] = {}
    if cfg.attacks.gradient_labels and record.is_file():
        received = read_recording(record)
        first_epoch = received[: max(1, len(data.x_train) // cfg.train.batch_size)]
        g = torch.cat([r[2] for r in first_epoch])
        y = torch.cat([data.y_train[r[1]] for r in first_epoch])
        got, chance = gradient_label_recovery(g, y, data.num_classes, cfg.seed)
        grad_labels = {"recovered": got, "chance": chance, "rows": len(y)}
        points.append(Point(victim.part, "labels_from_gradients", len(y), got, False, chance,
                            "k-means of the first epoch's received gradients"))
    best = max((p.agreement for p in points if p.attack.startswith(("predict", "eval"))), default=0.0)
    target = max(best, 0.9)
    note(f"completion from scratch with labels to agreement {target:.3f}")
    comp = completion_rows(victim, h_train, data.y_train, h_test, target, batch=cfg.train.batch_size,
                           seed=cfg.seed)
    summary = {"test_accuracy": accuracy, "completion_rows": {victim.part: comp}, "completion_target": target,
               "gradient_labels": grad_labels, "seconds": time.perf_counter() - t0,
               "policy": policy, "party": cfg.party}
    if progress is not None and phase:
        progress.done(phase[-1])
    write_extraction(out, points, summary)
    return {**summary, "points": [p.__dict__ for p in points]}

