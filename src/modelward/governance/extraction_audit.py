"""``modelward split audit-extraction CONFIG``: the neighbour attacks against real party processes under their real
policies (issue 26 item 3).

The run, all on 127.0.0.1 with mutual TLS:

1. Alice (the data owner, first part) and Bob (the rest, the labels) start as two ``party serve`` processes, with
   Bob's policy from the config (by default the shipped ``examples/policy_bob.toml``) and his PARTY.toml defaults
   (label protection, integrity). Alice's server records every gradient she receives
   (:class:`~modelward.governance.leakage.parties.RecordingParty`: what an honest-but-curious Alice keeps).
2. The driver — a control identity of its own, ``operator`` — trains the split as ``split train`` does.
3. Alice turns hostile. With her *data* key she sends Bob ``predict``, ``eval`` and ``step`` passes on activations
   of her choosing; with the *control* key of her organisation she tries to fetch the answers, and commits or aborts
   her steps. Every attack of :data:`ATTACKS` (one entry each, ``run(AuditContext) -> [Point]``: surrogates from
   ``predict``, the duplicate-index ``eval`` oracle, issue 36's eval differencing, label-only active learning and
   training-loss oracle, labels from answers and from gradients, the slow poisoning of
   :mod:`~modelward.governance.poisoning_audit`) runs until Bob refuses, withholds or halts; one that
   spends a day's budget runs against Bob restarted from his trained checkpoint on a fresh audit log.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import Field

from modelward.core.config import StrictModel, load_config
from modelward.core.data import DataConfig, load_data
from modelward.core.io import load_into, load_tensors
from modelward.core.progress import ProgressSink
from modelward.core.train import TrainConfig, evaluate
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ModelwardError
from modelward.governance import poisoning_audit
from modelward.governance.consent import Policy
from modelward.governance.neighbour_audit import (
    Point,
    Victim,
    Withheld,
    completion_rows,
    eval_differencing_curve,
    eval_oracle_curve,
    gradient_label_recovery,
    label_only_curve,
    labels_from_answers,
    loss_oracle,
    query_pool,
    surrogate_curve,
    write_extraction,
)
from modelward.governance.protocol import ConsentDenied

log = logging.getLogger(__name__)


class AttackSettings(StrictModel):
    """``[attacks]``: which attacks (:data:`ATTACKS`; ``skip`` names those not to run), and the rows at which each
    curve is measured. ``options``: settings of attacks registered from elsewhere, by attack name."""

    skip: list[str] = Field(default_factory=list)
    predict_pools: list[str] = Field(default_factory=lambda: ["natural", "augmented", "synthetic"])
    checkpoints: list[int] = Field(default_factory=lambda: [64, 256, 1024, 4096])
    chunk: int = Field(64, ge=1)  # rows per predict pass
    eval_points: list[int] = Field(default_factory=lambda: [1600, 8000])  # rows of the eval oracle (80 per point)
    # issue 36: eval differencing (80 rows per point; the issue: 0.908 agreement from 5,120 rows, 0.981 from
    # 20,480), the same averaging each answer over `differencing_repeats` passes, label-only active learning
    # (0.914 from 2,984 rows) and the training-loss oracle (400 of 400 labels; probes = training indices)
    differencing_points: list[int] = Field(default_factory=lambda: [640, 5120, 20480])
    differencing_repeats: int = Field(16, ge=1)
    label_only_points: list[int] = Field(default_factory=lambda: [800, 3000])
    loss_probes: int = Field(400, ge=0)
    loss_probes_committed: int = Field(40, ge=0)
    labels_rows: int = Field(256, ge=1)
    gradient_labels: bool = True
    fit_steps: int = Field(300, ge=1)
    options: dict[str, dict[str, Any]] = Field(default_factory=dict)


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
    """Alice's hostile passes on Bob, over mutual TLS: ``predict``/``eval``/``step`` with her data key; ``fetch``,
    ``vote``/``commit``/``abort`` and ``status`` with her organisation's control key (the operator's)."""

    def __init__(self, bob_address: str, data_tls, control_tls, bob_pin: str, timeout: float = 30.0) -> None:
        # lazy: the gRPC client (grpc, cryptography) loads when the oracle connects, not with the config
        from modelward.governance.transport.client import GrpcPartyClient
        from modelward.governance.wire import Message

        self._msg = Message
        self.data = GrpcPartyClient("bob", bob_address, data_tls, bob_pin, timeout=timeout)
        self.control = GrpcPartyClient("bob", bob_address, control_tls, bob_pin, timeout=timeout)
        self.session = "extract-" + secrets.token_hex(4)
        self.seq = int(self.data.call(self._msg("open", self.session)).meta["last_seq"])

    def _data(self, op: str, meta: dict, tensors: dict, step: int = 0) -> Any:
        self.seq += 1
        try:
            return self.data.call(self._msg(op, self.session, step, self.seq, meta, tensors))
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

    def eval_answer(self, h: torch.Tensor, idx: torch.Tensor, split: str, metric: str) -> dict:
        """The meta of Bob's answer to one evaluation pass (``sum``, ``n``, ``train_loss``, ``withheld``)."""
        return dict(self._data("eval", {"split": split, "metric": metric}, {"h": h.contiguous(), "idx": idx}).meta)

    def eval_sum(self, h: torch.Tensor, idx: torch.Tensor, split: str, metric: str) -> float:
        meta = self.eval_answer(h, idx, split, metric)
        if meta.get("sum") is None:
            raise Withheld(f"bob withheld the sum: {meta.get('withheld', '?')}")
        return float(meta["sum"])

    def train_step(self, h: torch.Tensor, idx: torch.Tensor, commit: bool = False) -> float | None:
        """A step on Bob at his current step with Alice's data key; what it tells her of the loss: the step's own
        answer (``meta.loss``, as the party of issue 36 returned it), then the step aborted with the control key;
        or, with `commit`, the step voted and committed and the training loss read from the next evaluation's
        answer (a pass over the fixed rows the oracle was given, :attr:`probe_eval`)."""
        step = int(self.control.call(self._msg("status", self.session)).meta["step"])
        r = self._data("step", {}, {"h": h.contiguous(), "idx": idx}, step=step)
        loss = r.meta.get("loss")
        if not commit:
            self.control.call(self._msg("abort", self.session, step))
            return None if loss is None else float(loss)
        self.control.call(self._msg("vote", self.session, step))
        self.control.call(self._msg("commit", self.session, step))
        h_eval, idx_eval = self.probe_eval
        meta = self.eval_answer(h_eval, idx_eval, "test", "error")
        if isinstance(meta.get("train_loss"), dict):
            return float(meta["train_loss"]["mean"])
        if "budget" in str(meta.get("withheld", "")):
            raise Withheld(f"bob withheld the training loss: {meta['withheld']}")
        return None

    probe_eval: tuple[torch.Tensor, torch.Tensor] = (torch.empty(0), torch.empty(0, dtype=torch.long))

    def close(self) -> None:
        self.data.close()
        self.control.close()


@dataclass
class AuditContext:
    """What an attack of the self-audit gets (the auditor stands in for both organisations: it reads Bob's part
    and the labels only to score, never to attack).

    Attributes:
        oracle: Alice's data key and the operator's control key on Bob (:class:`PartyOracle`).
        victim: Bob's part as exported after training (scoring only); data: the data split.
        h_train / h_test: Alice's activations of her training and test images (what she holds).
        settings: the ``[attacks]`` table (``settings.options[name]``: an attack's own settings).
        seed: the attacks' randomness; split: the running parties (:class:`~.demo.LocalSplit`).
        recording: the gradients Alice's server recorded in training (a safetensors file).
        known_test / known_train: one test and one training index per class (the attacker is assumed to know a
            handful of labels, as the issue's attacks did).
    """

    oracle: PartyOracle
    victim: Victim
    data: Any
    h_train: torch.Tensor
    h_test: torch.Tensor
    settings: AttackSettings
    seed: int
    split: Any
    recording: Path
    known_test: dict[int, int] = field(default_factory=dict)
    known_train: dict[int, int] = field(default_factory=dict)

    def fixed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The 7 fixed rows of the differencing attacks: test indices 0..6 (none of them a known index) with
        activations of Alice's own training images."""
        return self.h_train[:7], torch.arange(7)


@dataclass(frozen=True)
class Attack:
    """One attack of the self-audit: ``run(context) -> [Point]``.

    Args:
        name: its name (``[attacks] skip`` takes it).
        run: the attack.
        enabled: whether the settings ask for it.
        fresh_budget: it gets a UTC day's answer and privacy budget of its own (Bob restarts from his trained
            checkpoint on a fresh audit log first), so the table says what one day buys *this* attack.
        changes_bob: it commits steps on Bob (run after every attack that does not).
    """

    name: str
    run: Callable[[AuditContext], list[Point]]
    enabled: Callable[[AttackSettings], bool] = lambda a: True
    fresh_budget: bool = False
    changes_bob: bool = False


def _predict(c: AuditContext) -> list[Point]:
    a, out = c.settings, []
    for pool in a.predict_pools:
        queries = query_pool(pool, c.h_train, max(a.checkpoints), c.seed)
        out += surrogate_curve(c.oracle, c.victim, queries, c.h_test, a.checkpoints, f"predict_{pool}", a.chunk,
                               a.fit_steps, c.seed)
    return out


def _eval_oracle(c: AuditContext) -> list[Point]:
    a = c.settings
    queries = query_pool("natural", c.h_train, max(a.eval_points) // (8 * c.victim.num_classes) + 1, c.seed)
    return eval_oracle_curve(c.oracle, c.victim, queries, c.h_test, c.known_test, a.eval_points,
                             fit_steps=a.fit_steps, seed=c.seed)


def _differencing(repeats: int) -> Callable[[AuditContext], list[Point]]:
    def run(c: AuditContext) -> list[Point]:
        a = c.settings
        points = [p for p in a.differencing_points if p >= 80 * repeats]
        if not points:
            return []
        queries = query_pool("natural", c.h_train, max(points) // (80 * repeats) + 1, c.seed + 1)
        return eval_differencing_curve(c.oracle, c.victim, queries, c.h_test, *c.fixed(), c.known_test, points,
                                       repeats=repeats, fit_steps=a.fit_steps, seed=c.seed)
    return run


def _label_only(c: AuditContext) -> list[Point]:
    pool = query_pool("natural", c.h_train, len(c.h_train), c.seed + 2)
    return label_only_curve(c.oracle, c.victim, pool, c.h_test, *c.fixed(), c.known_test,
                            c.settings.label_only_points, fit_steps=c.settings.fit_steps, seed=c.seed)


def _loss_oracle(commit: bool) -> Callable[[AuditContext], list[Point]]:
    def run(c: AuditContext) -> list[Point]:
        n = c.settings.loss_probes_committed if commit else c.settings.loss_probes
        probes = torch.arange(len(c.h_train) - n, len(c.h_train))  # (not among the fixed rows 0..6)
        c.oracle.probe_eval = (c.h_train[:8], torch.arange(8))  # (min_batch distinct indices)
        return [loss_oracle(c.oracle, probes, c.data.y_train, c.h_train[:7], torch.arange(7), c.h_train[7],
                            c.known_train, c.victim.part, commit=commit)]
    return run


def _labels_from_answers(c: AuditContext) -> list[Point]:
    return [labels_from_answers(c.oracle, c.h_train, c.data.y_train, c.settings.labels_rows, c.victim.part,
                                c.settings.chunk)]


def _labels_from_gradients(c: AuditContext) -> list[Point]:
    # lazy: the recording reader lives with the recording server (gRPC); load it only when a recording is read
    from modelward.governance.leakage.parties import read_recording

    if not c.recording.is_file():
        return []
    first_epoch = read_recording(c.recording)[: max(1, len(c.data.x_train) // 64)]
    g = torch.cat([r[2] for r in first_epoch])
    y = torch.cat([c.data.y_train[r[1]] for r in first_epoch])
    got, chance = gradient_label_recovery(g, y, c.data.num_classes, c.seed)
    return [Point(c.victim.part, "labels_from_gradients", len(y), got, False, chance,
                  "k-means of the first epoch's received gradients")]


# The self-audit's attacks, in the order they run (an attack that commits steps on Bob after those that do not).
# Registering one more is one line: ATTACKS.append(Attack("name", module.run, changes_bob=True)), `run` taking an
# AuditContext and returning neighbour_audit.Point rows (issue 36 item 7: every composition attack is one entry).
ATTACKS: list[Attack] = [
    Attack("predict", _predict, lambda a: bool(a.predict_pools and a.checkpoints)),
    Attack("eval_oracle", _eval_oracle, lambda a: bool(a.eval_points)),
    Attack("eval_differencing", _differencing(1), lambda a: bool(a.differencing_points), fresh_budget=True),
    Attack("eval_differencing_repeated", lambda c: _differencing(c.settings.differencing_repeats)(c),
           lambda a: bool(a.differencing_points) and a.differencing_repeats > 1, fresh_budget=True),
    Attack("label_only", _label_only, lambda a: bool(a.label_only_points), fresh_budget=True),
    Attack("loss_oracle", _loss_oracle(False), lambda a: a.loss_probes > 0),
    Attack("labels_from_answers", _labels_from_answers),
    Attack("labels_from_gradients", _labels_from_gradients, lambda a: a.gradient_labels),
    Attack("loss_oracle_committed", _loss_oracle(True), lambda a: a.loss_probes_committed > 0, fresh_budget=True,
           changes_bob=True),
]
# issue 36 item 2: the slow poisoning of Bob's part through activations (settings: [attacks.options.slow_poisoning])
ATTACKS.append(Attack("slow_poisoning", poisoning_audit.run, changes_bob=True))


def run_extraction_audit(cfg: ExtractionAuditConfig, out_dir: str | Path,
                         progress: ProgressSink | None = None) -> dict[str, Any]:
    """Run the audit (module docstring). Returns the summary written to ``extraction.json``."""
    # lazy: the driver, the party processes and gRPC load when the audit runs, not with load_extraction_config
    from modelward.governance.demo import prepare_local_split
    from modelward.governance.driver import SplitDriver
    from modelward.governance.leakage.parties import start_recording_party
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

    tls = {n: TLSConfig(ca=str(root / "certs/ca.pem"), cert=str(root / f"certs/{n}.pem"),
                        key=str(root / f"certs/{n}.key")) for n in ("alice", "operator")}

    def connect() -> PartyOracle:
        pin = split.split_config(tc, cfg.seed).parties[1].pin()
        return PartyOracle(split.processes["bob"].address, tls["alice"], tls["operator"], pin)

    def fresh_bob(n: int) -> None:
        """Bob restarted from his trained checkpoint on a fresh audit log: a UTC day's budgets of its own."""
        split.processes.pop("bob").stop()
        for f in (root / "bob").glob("audit.db*"):
            f.rename(f.with_name(f.name.replace("audit.db", f"audit-{n}.db")))
        split.start(["bob"])

    points: list[Point] = []
    try:
        split.start(["bob"])
        split.processes["alice"] = start_recording_party(split.party_configs["alice"],
                                                         root / "alice" / "server.log", record)
        note("training the split (operator drives; alice records the gradients she receives)")
        with SplitDriver(split.split_config(tc, cfg.seed, retry_s=0.0, timeout_s=120.0)) as drv:
            res = drv.train()
            exports = drv.checkpoint_all(export=True)
        reported = 1.0 - float(res.curve[-1][1])  # what bob released to the driver (noisy, under the defaults)
        state = {k: v for m in exports.values() for k, v in load_tensors(m["export"]).items()}
        full = build_model(cfg.model, data.input_shape, data.num_classes)
        load_into(full, state, "the parties' exported checkpoints")
        full.eval()
        accuracy = 1.0 - evaluate(full, data.x_test, data.y_test)  # the auditor scores the exported parts
        bob_layers = split.owners["bob"]
        alice_part, bob_part = segment_of(full, split.owners["alice"]), segment_of(full, bob_layers)
        with torch.no_grad():
            h_train, h_test = alice_part(data.x_train), alice_part(data.x_test)

        def fresh() -> torch.nn.Module:
            m = build_model(cfg.model, data.input_shape, data.num_classes)
            return segment_of(m, bob_layers)

        victim = Victim(f"bob ({','.join(bob_layers)})", bob_part, fresh, data.num_classes)
        ctx = AuditContext(connect(), victim, data, h_train, h_test, cfg.attacks, cfg.seed, split, record)
        for c in range(data.num_classes):  # one known label per class, never among the fixed rows 0..6
            hit = (data.y_test[7:] == c).nonzero()
            if len(hit):
                ctx.known_test[c] = int(hit[0]) + 7
            ctx.known_train[c] = int((data.y_train == c).nonzero()[0])
        attacks = [a for a in ATTACKS if a.name not in cfg.attacks.skip and a.enabled(cfg.attacks)]
        restarts = 0
        try:
            for attack in sorted(attacks, key=lambda a: a.changes_bob):
                if attack.fresh_budget:
                    ctx.oracle.close()
                    restarts += 1
                    note(f"bob restarted on a fresh audit log (a day's budget of its own) for {attack.name}")
                    fresh_bob(restarts)
                    ctx.oracle = connect()
                note(attack.name)
                points += attack.run(ctx)
        finally:
            ctx.oracle.close()
    finally:
        split.stop()
    grad = next((p for p in points if p.attack == "labels_from_gradients"), None)
    grad_labels = {"recovered": grad.agreement, "chance": grad.chance, "rows": grad.rows} if grad else {}
    best = max((p.agreement for p in points if p.attack.startswith(("predict", "eval"))), default=0.0)
    target = max(best, 0.9)
    note(f"completion from scratch with labels to agreement {target:.3f}")
    comp = completion_rows(victim, h_train, data.y_train, h_test, target, batch=cfg.train.batch_size,
                           seed=cfg.seed)
    summary = {"test_accuracy": accuracy, "reported_accuracy": reported, "completion_rows": {victim.part: comp}, "completion_target": target,
               "gradient_labels": grad_labels, "seconds": time.perf_counter() - t0,
               "policy": policy, "party": cfg.party}
    if progress is not None and phase:
        progress.done(phase[-1])
    write_extraction(out, points, summary)
    return {**summary, "points": [p.__dict__ for p in points]}
