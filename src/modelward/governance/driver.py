"""Driver: split training and inference over running party servers (seed 000 §1, steps 1–5).

The driver runs at the data owner's site and only ever sends batch *indices* to the first and last party (each
looks up its own inputs / labels), relays activations forward and gradients backward, and records bytes and time
per link and per step. Data order, learning-rate schedule and optimizer are exactly those of
:func:`modelward.core.train.train`, so split training reproduces monolithic training.

Crash safety: when a party disappears mid-step, the driver waits for it to come back, restores *every* party to the
latest checkpoint step they all hold, rewinds the seeded batch order to that step and continues: no step is lost or
applied twice. Sequence numbers make retried requests idempotent.
"""

from __future__ import annotations

import csv
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import torch
from pydantic import Field, model_validator

from modelward.core.config import StrictModel, dump_config, load_config
from modelward.core.train import TrainConfig, batch_order
from modelward.errors import ModelwardError
from modelward.governance.certs import check_name, read_pem
from modelward.governance.party import METHOD, ConsentDenied, PartyError, TLSConfig, _resolve
from modelward.governance.wire import Message, WireError, decode, encode


class PartyUnavailable(ModelwardError):
    """A party cannot be reached (not started, crashed, or refused the TLS handshake)."""


class PartyRef(StrictModel):
    name: str
    address: str  # host:port


class SplitConfig(StrictModel):
    """``SPLIT.toml``: the parties in chain order, the driver's identity, and the training procedure."""

    parties: list[PartyRef]
    tls: TLSConfig  # the driver's client certificate (usually the data owner's)
    train: TrainConfig = Field(default_factory=TrainConfig)
    seed: int = 0  # data order (batch_order), as in core.train.train(seed=...)
    out_dir: str = "runs/split"
    session: str | None = None  # default: a fresh id, kept in out_dir/session.json so reruns resume
    timeout_s: float = Field(60.0, gt=0)  # per request
    retry_s: float = Field(120.0, ge=0)  # how long to wait for a crashed party to come back
    max_message_mb: float = Field(64.0, gt=0)

    @model_validator(mode="after")
    def _chain(self) -> SplitConfig:
        if len(self.parties) < 2:
            raise ValueError("parties: a split needs at least 2 parties ([[parties]] name/address, in chain order)")
        names = [check_name(p.name) for p in self.parties]
        if len(set(names)) != len(names):
            raise ValueError(f"parties: names must be distinct, got {names}")
        return self


def load_split_config(path: str | Path, overrides: list[str] | None = None) -> SplitConfig:
    cfg = load_config(path, SplitConfig, overrides)
    base = Path(path).resolve().parent
    cfg.tls = TLSConfig(ca=_resolve(base, cfg.tls.ca), cert=_resolve(base, cfg.tls.cert),
                        key=_resolve(base, cfg.tls.key))
    cfg.out_dir = _resolve(base, cfg.out_dir)
    return cfg


@dataclass
class LinkStats:
    sent: int = 0
    received: int = 0
    raw: int = 0  # bytes of activation/gradient tensors alone (the physical floor)
    seconds: float = 0.0


@dataclass
class SplitTrainResult:
    curve: list[tuple[int, float]]
    steps_run: int
    seconds: float
    links: dict[str, dict[str, float]]
    resumes: int
    audit_heads: dict[str, str]
    train_loss: list[tuple[int, float]] = field(default_factory=list)


_ERRORS: dict[grpc.StatusCode, type[ModelwardError]] = {
    grpc.StatusCode.PERMISSION_DENIED: ConsentDenied, grpc.StatusCode.INVALID_ARGUMENT: WireError,
    grpc.StatusCode.FAILED_PRECONDITION: PartyError, grpc.StatusCode.UNAVAILABLE: PartyUnavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: PartyUnavailable, grpc.StatusCode.UNAUTHENTICATED: ConsentDenied,
}


class SplitDriver:
    """Talks to the parties of one split, in chain order, over mutually authenticated TLS channels."""

    def __init__(self, cfg: SplitConfig, session: str | None = None) -> None:
        self.cfg = cfg
        self.names = [p.name for p in cfg.parties]
        self.session = session or cfg.session or uuid.uuid4().hex
        creds = grpc.ssl_channel_credentials(read_pem(cfg.tls.ca, "tls.ca"), read_pem(cfg.tls.key, "tls.key"),
                                             read_pem(cfg.tls.cert, "tls.cert"))
        limit = int(cfg.max_message_mb * 2**20) + 65536
        self.channels, self.stubs = {}, {}
        for p in cfg.parties:
            # the server certificate must name this party: the driver pins whom it talks to
            ch = grpc.secure_channel(p.address, creds, options=[("grpc.ssl_target_name_override", p.name),
                                                                ("grpc.max_receive_message_length", limit),
                                                                # a restarted party is found within a second
                                                                ("grpc.initial_reconnect_backoff_ms", 200),
                                                                ("grpc.min_reconnect_backoff_ms", 200),
                                                                ("grpc.max_reconnect_backoff_ms", 1000),
                                                                ("grpc.max_send_message_length", limit)])
            self.channels[p.name] = ch
            self.stubs[p.name] = ch.unary_unary(METHOD)
        self.seq = dict.fromkeys(self.names, 0)
        self.links = {n: LinkStats() for n in self.names}
        self.status: dict[str, dict[str, Any]] = {}

    def close(self) -> None:
        for ch in self.channels.values():
            ch.close()

    def __enter__(self) -> SplitDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ transport
    def call(self, party: str, op: str, step: int = 0, meta: dict | None = None,
             tensors: dict[str, torch.Tensor] | None = None, timeout: float | None = None) -> Message:
        sequenced = op not in ("status", "open")
        seq = self.seq[party] + 1 if sequenced else 0
        req = encode(Message(op, self.session, step, seq, meta or {}, tensors or {}))
        link = self.links[party]
        t0 = time.perf_counter()
        try:
            resp = self.stubs[party](req, timeout=timeout or self.cfg.timeout_s)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
            kind = _ERRORS.get(code, PartyError)
            detail = e.details() if hasattr(e, "details") else str(e)
            if kind is PartyUnavailable:
                detail = f"party {party} unreachable: {detail}"
            raise kind(detail) from None
        finally:
            link.seconds += time.perf_counter() - t0
        link.sent += len(req)
        link.received += len(resp)
        link.raw += sum(t.numel() * t.element_size() for k, t in (tensors or {}).items() if k in ("h", "g"))
        out = decode(resp, max_bytes=int(self.cfg.max_message_mb * 2**20) + 65536)
        link.raw += sum(t.numel() * t.element_size() for k, t in out.tensors.items() if k in ("h", "g"))
        if sequenced:
            self.seq[party] = seq
        return out

    def open(self, train: bool) -> dict[str, dict[str, Any]]:
        """Open (or rejoin) the session on every party and check that they form the expected chain."""
        meta = {"train_cfg": self.cfg.train.model_dump(mode="json")} if train else {}
        for n in self.names:
            st = self.call(n, "open", meta=meta).meta
            if st.get("party") != n:
                raise PartyError(f"party at {self._addr(n)} says it is {st.get('party')!r}, expected {n!r}")
            self.status[n] = st
            self.seq[n] = int(st["last_seq"])
        self._check_chain()
        return self.status

    def _addr(self, n: str) -> str:
        return next(p.address for p in self.cfg.parties if p.name == n)

    def _check_chain(self) -> None:
        st = [self.status[n] for n in self.names]
        all_layers = st[0]["all_layers"]
        joined = [lay for s in st for lay in s["layers"]]
        if joined != all_layers:
            raise PartyError(f"the parties' layers {[s['layers'] for s in st]} (in config order "
                             f"{self.names}) do not chain into the model's layers {all_layers}")
        if not st[0]["first"] or not st[-1]["last"]:
            raise PartyError("the first party must hold the inputs and the last one the labels")
        for a, b in zip(st[:-1], st[1:], strict=True):
            if a["out_shape"] != b["in_shape"]:
                raise PartyError(f"{a['party']} outputs {a['out_shape']} but {b['party']} expects {b['in_shape']}")
        if st[0]["n_train"] != st[-1]["n_train"] or st[0]["n_test"] != st[-1]["n_test"]:
            raise PartyError(f"inputs ({st[0]['n_train']}/{st[0]['n_test']} train/test samples) and labels "
                             f"({st[-1]['n_train']}/{st[-1]['n_test']}) are not aligned")

    # ------------------------------------------------------------------ passes
    def train_step(self, step: int, idx: torch.Tensor) -> float:
        """One protocol step (seed 000 §1 steps 1–5) for all parties; returns the training loss."""
        first, last, mids = self.names[0], self.names[-1], self.names[1:-1]
        h = self.call(first, "forward", step, {"purpose": "train", "split": "train"}, {"idx": idx}).tensors["h"]
        for n in mids:
            h = self.call(n, "forward", step, {"purpose": "train"}, {"h": h}).tensors["h"]
        r = self.call(last, "loss_backward", step, {"split": "train"}, {"h": h, "idx": idx})
        loss, g = float(r.meta["loss"]), r.tensors["g"]
        for n in reversed(self.names[:-1]):
            r = self.call(n, "backward", step, {}, {"g": g})
            g = r.tensors.get("g")
        return loss

    def _chain_forward(self, purpose: str, split: str, idx: torch.Tensor | None, x: torch.Tensor | None,
                       meta: dict | None = None) -> Message:
        first_in = {"idx": idx} if x is None else {"x": x}
        h = self.call(self.names[0], "forward", 0, {"purpose": purpose, "split": split}, first_in).tensors["h"]
        for n in self.names[1:-1]:
            h = self.call(n, "forward", 0, {"purpose": purpose}, {"h": h}).tensors["h"]
        extra = {"idx": idx} if (purpose == "eval" and idx is not None) else {}
        return self.call(self.names[-1], "forward", 0, {"purpose": purpose, "split": split, **(meta or {})},
                         {"h": h, **extra})

    def evaluate(self, metric: str = "error", batch_size: int = 1024) -> float:
        """Test loss like core.train.evaluate, computed by split inference (the last party scores its labels)."""
        n = int(self.status[self.names[0]]["n_test"])
        total = 0.0
        for i in range(0, n, batch_size):
            idx = torch.arange(i, min(n, i + batch_size))
            total += float(self._chain_forward("eval", "test", idx, None, {"metric": metric}).meta["sum"])
        return total / n

    def predict(self, split: str = "test", x: torch.Tensor | None = None, batch_size: int = 256) -> torch.Tensor:
        """Logits for the data owner's `split` (or for inputs `x`) through the whole chain."""
        outs = []
        if x is not None:
            for i in range(0, len(x), batch_size):
                outs.append(self._chain_forward("predict", split, None, x[i : i + batch_size]).tensors["logits"])
        else:
            n = int(self.status[self.names[0]][f"n_{split}"])
            for i in range(0, n, batch_size):
                idx = torch.arange(i, min(n, i + batch_size))
                outs.append(self._chain_forward("predict", split, idx, None).tensors["logits"])
        return torch.cat(outs)

    # ------------------------------------------------------------------ recovery
    def wait_all(self, deadline: float, train: bool) -> None:
        while True:
            try:
                self.open(train)
                return
            except PartyUnavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def resume_point(self) -> int:
        """Continue where all parties are, if they agree and none is mid-step; otherwise restore every party to
        the latest checkpoint step they all hold."""
        steps = {int(s["step"]) for s in self.status.values()}
        if len(steps) == 1 and not any(s["pending"] for s in self.status.values()):
            return steps.pop()
        common = set.intersection(*(set(s["checkpoints"]) for s in self.status.values()))
        target = max(common)
        for n in self.names:
            self.call(n, "restore", target, {"to_step": target})
        return target

    # ------------------------------------------------------------------ training loop
    def train(self, on_step: Callable[[int, float, dict[str, LinkStats]], None] | None = None,
              on_eval: Callable[[int, float], None] | None = None, out_dir: Path | None = None) -> SplitTrainResult:
        cfg, tc = self.cfg, self.cfg.train
        t0 = time.perf_counter()
        self.wait_all(time.monotonic() + cfg.retry_s, train=True)
        n_train = int(self.status[self.names[0]]["n_train"])
        step = self.resume_point()
        curve: list[tuple[int, float]] = []
        rows: list[dict[str, Any]] = []
        train_loss: list[tuple[int, float]] = []
        resumes = 0
        if out_dir is not None and (out_dir / "curve.json").is_file():
            prev = json.loads((out_dir / "curve.json").read_text())
            curve = [(int(s), float(v)) for s, v in prev if int(s) <= step]
            rows = [r for r in _read_rows(out_dir / "steps.csv") if int(r["step"]) < step]
        running, k = 0.0, 0

        def rewind(to: int):
            it = batch_order(n_train, tc.batch_size, cfg.seed)
            for _ in range(to):
                next(it)
            return it

        batches = rewind(step)
        if step == 0 or not curve:
            curve = [(step, self.evaluate(tc.loss, tc.eval_batch_size))]
            if on_eval:
                on_eval(*curve[-1])
        while step < tc.steps:
            idx = next(batches)
            before = {n: (s.sent, s.received, s.seconds) for n, s in self.links.items()}
            ts = time.perf_counter()
            try:
                loss = self.train_step(step, idx)
            except PartyUnavailable:
                if cfg.retry_s <= 0:
                    raise
                self.wait_all(time.monotonic() + cfg.retry_s, train=True)
                step = self.resume_point()
                resumes += 1
                batches = rewind(step)
                curve = [c for c in curve if c[0] <= step]
                rows = [r for r in rows if r["step"] < step]
                running, k = 0.0, 0
                continue
            row: dict[str, Any] = {"step": step, "loss": loss, "seconds": time.perf_counter() - ts}
            for n, s in self.links.items():
                row[f"{n}_sent"] = s.sent - before[n][0]
                row[f"{n}_received"] = s.received - before[n][1]
                row[f"{n}_seconds"] = round(s.seconds - before[n][2], 6)
            rows.append(row)
            step += 1
            running, k = running + loss, k + 1
            if on_step:
                on_step(step, loss, self.links)
            if step % tc.eval_every == 0 or step == tc.steps:
                curve.append((step, self.evaluate(tc.loss, tc.eval_batch_size)))
                train_loss.append((step, running / max(k, 1)))
                running, k = 0.0, 0
                if on_eval:
                    on_eval(*curve[-1])
                if out_dir is not None:
                    _write_progress(out_dir, curve, rows)
        heads = {n: self.call(n, "status").meta["audit_head"] for n in self.names}
        result = SplitTrainResult(curve, step, time.perf_counter() - t0, self.link_summary(), resumes, heads,
                                  train_loss)
        if out_dir is not None:
            _write_progress(out_dir, curve, rows)
        return result

    def link_summary(self) -> dict[str, dict[str, float]]:
        return {f"driver<->{n}": asdict(s) for n, s in self.links.items()}

    def checkpoint_all(self, export: bool = False) -> dict[str, dict[str, Any]]:
        return {n: self.call(n, "checkpoint", 0, {"export": export}).meta for n in self.names}


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return [{k: (int(v) if k == "step" else float(v)) for k, v in r.items()} for r in csv.DictReader(f)]


def _write_progress(out_dir: Path, curve: list[tuple[int, float]], rows: list[dict[str, Any]]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "curve.json").write_text(json.dumps(curve))
    if rows:
        tmp = out_dir / "steps.csv.tmp"
        with tmp.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        tmp.replace(out_dir / "steps.csv")


def run_training(cfg: SplitConfig, on_step=None, on_eval=None) -> SplitTrainResult:
    """`modelward split train`: resumable (the session id lives in out_dir/session.json); writes curve.json,
    steps.csv (per step: loss, seconds, bytes per link), summary.json and the resolved config."""
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sess_file = out / "session.json"
    session = cfg.session
    if session is None and sess_file.is_file():
        session = json.loads(sess_file.read_text())["session"]
    session = session or uuid.uuid4().hex
    sess_file.write_text(json.dumps({"session": session}))
    dump_config(cfg, out / "config.json")
    with SplitDriver(cfg, session) as drv:
        res = drv.train(on_step, on_eval, out)
    summary = {"steps": res.steps_run, "seconds": res.seconds, "resumes": res.resumes,
               "final_loss": res.curve[-1][1], "links": res.links, "audit_heads": res.audit_heads}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return res
