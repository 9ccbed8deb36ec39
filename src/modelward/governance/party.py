"""A party of a split model: holds one contiguous segment, its optimizer state and its own data column.

The paper's protocol (seed 000 §1): the first party (Alice) holds the inputs and the first layers; the last (Bob)
holds the remaining layers and the labels. One training step s is

    forward(s)  P0 → … → P[n-2]     each returns its activation h (kept with its autograd graph)
    loss_backward(s)  P[n-1]        loss from its labels, backward, optimizer step, returns dL/dh
    backward(s)  P[n-2] → … → P0    backward through the kept graph, optimizer step, returns dL/dh_in

Every pass goes through consent (deny by default) and into the hash-chained audit log before any compute. The
party process never holds another party's parameters: it builds the model's structure, initialises it (from a
seed or from the safetensors entries of its own layers) and keeps only its segment.

:class:`Party` is the transport-free state machine; :class:`PartyServer` exposes it over gRPC with mutual TLS
(one generic bytes-in/bytes-out method; framing in :mod:`modelward.governance.wire`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import torch
import torch.nn.functional as F
from pydantic import Field, field_validator, model_validator

from modelward.core.config import StrictModel, load_config, validate
from modelward.core.data import DataConfig, load_data
from modelward.core.init import INIT_SCHEMES, init_model_
from modelward.core.io import load_tensors, optimizer_from_tensors, optimizer_to_tensors, save_tensors
from modelward.core.train import TrainConfig, make_optimizer
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError, ModelwardError
from modelward.governance.audit import AuditLog
from modelward.governance.certs import check_name, read_pem
from modelward.governance.consent import ConsentChecker, PassRequest, Policy
from modelward.governance.plan import check_segment, model_layers, run_ops, segment_of
from modelward.governance.wire import Message, SequenceGuard, WireError, decode, encode, expect

SERVICE = "modelward.Party"
METHOD = f"/{SERVICE}/Call"
CKPT_RE = re.compile(r"^step_(\d{8})\.safetensors$")


class PartyError(ModelwardError):
    """A request cannot be served in the party's current state (wrong step, no pending forward, ...)."""


class ConsentDenied(ModelwardError):
    """The party's consent policy refused the pass."""


class TLSConfig(StrictModel):
    ca: str  # CA certificate(s) that sign the peers' certificates (PEM; may be a bundle)
    cert: str  # this party's certificate
    key: str  # this party's private key


class InitConfig(StrictModel):
    scheme: str = "glorot_uniform"
    seed: int = 0
    checkpoint: str | None = None  # safetensors with (at least) this party's parameters; overrides scheme/seed

    @field_validator("scheme")
    @classmethod
    def _scheme(cls, v: str) -> str:
        if v not in INIT_SCHEMES:
            raise ValueError(f"got {v!r}; valid choices: {list(INIT_SCHEMES)}")
        return v


class PartyData(StrictModel):
    """This party's own data: the inputs (first party) or the labels (last party), aligned by sample index."""

    file: str | None = None  # safetensors with x_train/x_test (inputs) or y_train/y_test (labels)
    dataset: DataConfig | None = None  # or a modelward data source; the party keeps only its column

    @model_validator(mode="after")
    def _one(self) -> PartyData:
        if (self.file is None) == (self.dataset is None):
            raise ValueError("give exactly one of data.file (safetensors) or [data.dataset] (a data source)")
        return self


class PartyConfig(StrictModel):
    """``PARTY.toml``: who this party is, where it listens, what it holds, and whom it trusts."""

    name: str
    host: str = "127.0.0.1"
    port: int = Field(50051, ge=0, le=65535)  # 0 = pick a free port (printed at startup)
    layers: list[str]
    input_shape: list[int]  # the whole model's input shape (without batch), e.g. [1, 8, 8]
    num_classes: int = Field(ge=2)
    model: ModelConfig = Field(default_factory=ModelConfig)
    init: InitConfig = Field(default_factory=InitConfig)
    data: PartyData | None = None
    tls: TLSConfig
    policy: Policy = Field(default_factory=Policy)
    policy_file: str | None = None  # a TOML file with the policy table's keys (instead of [policy])
    checkpoint_dir: str
    checkpoint_every: int = Field(10, ge=1)
    keep_checkpoints: int = Field(3, ge=2)
    audit_db: str
    max_message_mb: float = Field(64.0, gt=0)
    max_batch: int = Field(4096, ge=1)  # hard limit on rows per message, independent of the policy
    threads: int = Field(0, ge=0)  # torch threads (0 = torch default)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v)


def _resolve(base: Path, p: str | None) -> str | None:
    if p is None:
        return None
    q = Path(p).expanduser()
    return str(q if q.is_absolute() else (base / q))


def load_party_config(path: str | Path, overrides: list[str] | None = None) -> PartyConfig:
    """Load PARTY.toml; relative paths are relative to the file's folder."""
    cfg = load_config(path, PartyConfig, overrides)
    return resolve_paths(cfg, Path(path).resolve().parent)


def resolve_paths(cfg: PartyConfig, base: Path) -> PartyConfig:
    cfg = cfg.model_copy(deep=True)
    cfg.tls = TLSConfig(ca=_resolve(base, cfg.tls.ca), cert=_resolve(base, cfg.tls.cert),
                        key=_resolve(base, cfg.tls.key))
    cfg.checkpoint_dir = _resolve(base, cfg.checkpoint_dir)
    cfg.audit_db = _resolve(base, cfg.audit_db)
    if cfg.init.checkpoint:
        cfg.init.checkpoint = _resolve(base, cfg.init.checkpoint)
    if cfg.data and cfg.data.file:
        cfg.data.file = _resolve(base, cfg.data.file)
    if cfg.policy_file:
        if cfg.policy != Policy():
            raise ConfigError("give the consent policy either as [policy] or as policy_file, not both")
        cfg.policy_file = _resolve(base, cfg.policy_file)
        cfg.policy = load_config(cfg.policy_file, Policy)
    return cfg


def _digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(tensors):
        t = tensors[k].detach().contiguous().cpu()
        h.update(k.encode())
        h.update(str(t.dtype).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _layout(x: torch.Tensor) -> torch.Tensor:
    """A private copy of an input in the layout the CPU convolution kernels are fastest with: channels-last for
    image batches (what a monolithic run gets from torch's own stride choice, e.g. for 1-channel digits), as is
    for anything else. Values are unchanged; only the memory order differs."""
    if x.dim() == 4 and x.is_floating_point():
        return x.clone(memory_format=torch.channels_last)
    return x.clone()


def _format_of(t: torch.Tensor) -> torch.memory_format:
    if t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def _opt_fields(tc: TrainConfig) -> dict[str, Any]:
    """What fixes a party's parameter trajectory (run length and evaluation cadence may change between runs)."""
    return tc.model_dump(mode="json", include={"optimizer", "lr", "momentum", "weight_decay", "lr_schedule"})


@dataclass
class _Pending:
    step: int
    inp: torch.Tensor | None  # None for the first party (no gradient to return)
    out: torch.Tensor
    x: torch.Tensor  # the input it was computed from: a retried forward must carry the same input


class Party:
    """The state machine of one party (no transport). All public methods take the caller's identity."""

    def __init__(self, cfg: PartyConfig) -> None:
        self.cfg = cfg
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        full = build_model(cfg.model, tuple(cfg.input_shape), cfg.num_classes)
        layers = model_layers(full)
        names = [lay.name for lay in layers]
        start, end = check_segment(names, cfg.layers, f"party {cfg.name}: layers")
        self.all_layers, self.is_first, self.is_last = names, start == 0, end == len(names)
        # activation shapes at every cut, from a dry run of the structure (no data involved)
        with torch.no_grad():
            full.eval()
            x = torch.zeros(2, *cfg.input_shape)
            shapes = [tuple(x.shape[1:])]
            for lay in layers:
                x = run_ops(full, lay.ops, x)
                shapes.append(tuple(x.shape[1:]))
        self.in_shape, self.out_shape = shapes[start], shapes[end]
        if cfg.init.checkpoint is None:
            init_model_(full, cfg.init.scheme, cfg.init.seed)
        self.segment = segment_of(full, cfg.layers, f"party {cfg.name}")
        del full  # the other parties' layers go out of scope here
        if cfg.init.checkpoint is not None:
            self._load_own(cfg.init.checkpoint)
        self.segment.train()
        self.params = dict(self.segment.named_parameters())
        self._load_data()
        self.audit = AuditLog(cfg.audit_db, cfg.name)
        self.consent = ConsentChecker(cfg.policy, self.audit)
        self.guard = SequenceGuard()
        self.lock = threading.RLock()
        self._ckpt_thread: threading.Thread | None = None
        self._ckpt_error: str | None = None
        self._warm: set[int] = set()  # batch sizes whose kernels have run once in this process
        self.ckpt_dir = Path(cfg.checkpoint_dir)
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        self.step = 0
        self.train_cfg: TrainConfig | None = None
        self.opt: torch.optim.Optimizer | None = None
        self.pending: _Pending | None = None
        # the first optimizer in a process imports a lot of torch; pay that before READY, not on the first request
        make_optimizer([torch.nn.Parameter(torch.zeros(1))], TrainConfig()).step()
        latest = self.checkpoints()
        if latest:
            self._restore(latest[-1])
        else:
            self._save_checkpoint()

    # ----------------------------------------------------------------- setup
    def _load_own(self, path: str) -> None:
        from safetensors import safe_open

        own = self.segment.state_dict()
        try:
            with safe_open(path, framework="pt") as f:
                keys = set(f.keys())
                missing = [k for k in own if k not in keys]
                if missing:
                    raise ConfigError(f"init.checkpoint {path}: missing this party's tensors {missing[:5]}")
                loaded = {k: f.get_tensor(k) for k in own}  # read only our own entries
        except (OSError, ValueError) as e:
            raise ConfigError(f"init.checkpoint {path}: cannot read ({e})") from None
        try:
            self.segment.load_state_dict(loaded)
        except RuntimeError as e:
            raise ConfigError(f"init.checkpoint {path}: tensors do not fit the model ({e})") from None

    def _load_data(self) -> None:
        self.x_train = self.x_test = self.y_train = self.y_test = None
        need = (["x_train", "x_test"] if self.is_first else []) + (["y_train", "y_test"] if self.is_last else [])
        if not need:
            return
        d = self.cfg.data
        if d is None:
            raise ConfigError(f"party {self.cfg.name}: holds the {'inputs' if self.is_first else 'labels'} "
                              f"(layers {self.cfg.layers}) and needs a [data] section")
        if d.file:
            t = load_tensors(d.file)
            missing = [k for k in need if k not in t]
            if missing:
                raise ConfigError(f"data.file {d.file}: missing tensors {missing} (has {sorted(t)})")
            src = {k: t[k] for k in need}
        else:
            split = load_data(d.dataset)
            src = {k: getattr(split, k) for k in need}
        for k, v in src.items():
            setattr(self, k, v)
        if self.is_first:
            for k in ("x_train", "x_test"):
                if tuple(getattr(self, k).shape[1:]) != tuple(self.cfg.input_shape):
                    raise ConfigError(f"data: {k} has shape {list(getattr(self, k).shape[1:])} per sample, "
                                      f"input_shape is {self.cfg.input_shape}")
                setattr(self, k, getattr(self, k).float())
        if self.is_last:
            self.y_train, self.y_test = self.y_train.long(), self.y_test.long()

    # ----------------------------------------------------------------- checkpoints
    def checkpoints(self) -> list[int]:
        self._ckpt_join()
        return self._list_checkpoints()

    def _list_checkpoints(self) -> list[int]:
        return sorted(int(m.group(1)) for p in self.ckpt_dir.glob("step_*.safetensors")
                      if (m := CKPT_RE.match(p.name)))

    def _ckpt_path(self, step: int) -> Path:
        return self.ckpt_dir / f"step_{step:08d}.safetensors"

    def _state_tensors(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors = {f"model.{k}": v for k, v in self.segment.state_dict().items()}
        meta: dict[str, Any] = {"step": self.step, "party": self.cfg.name, "layers": self.cfg.layers}
        if self.opt is not None and self.train_cfg is not None:
            ot, skel = optimizer_to_tensors(self.opt)
            tensors.update(ot)
            meta["opt"] = skel
            meta["train_cfg"] = self.train_cfg.model_dump(mode="json")
            meta["opt_params"] = list(self.params)
        return tensors, meta

    def _save_checkpoint(self, background: bool = False) -> Path:
        """Checkpoint the current state. In the background, the state is snapshotted (copied) now and written
        by a thread while training goes on: a checkpoint file appears atomically (temp file + rename) or not at
        all, and the driver only ever restores to a step every party holds, so a crash during the write costs
        nothing but a few steps of recomputation. One write at a time; listing checkpoints waits for it."""
        self._ckpt_join()
        tensors, meta = self._state_tensors()
        path = self._ckpt_path(self.step)
        md = {"modelward": json.dumps(meta)}
        if not background:
            save_tensors(path, tensors, md)
            self._prune()
            return path
        snap = {k: v.detach().clone(memory_format=torch.contiguous_format) for k, v in tensors.items()}
        self._ckpt_thread = threading.Thread(target=self._write_snapshot, args=(path, snap, md),
                                             name=f"checkpoint-{self.step}", daemon=True)
        self._ckpt_thread.start()
        return path

    def _write_snapshot(self, path: Path, snap: dict[str, torch.Tensor], md: dict[str, str]) -> None:
        from safetensors.torch import save_file

        tmp = path.with_name(path.name + ".tmp")
        try:
            save_file(snap, str(tmp), metadata=md)
            os.replace(tmp, path)
            self._prune()
        except Exception as e:  # surfaced to the next request (before it computes anything)
            self._ckpt_error = f"checkpoint {path.name} could not be written: {type(e).__name__}: {e}"

    def _ckpt_join(self) -> None:
        t = self._ckpt_thread
        if t is not None:
            t.join()
            self._ckpt_thread = None

    def _raise_ckpt_error(self) -> None:
        err, self._ckpt_error = self._ckpt_error, None
        if err:
            raise PartyError(f"party {self.cfg.name}: {err}")

    def _prune(self) -> None:
        for old in self._list_checkpoints()[: -self.cfg.keep_checkpoints]:
            if old != 0:  # step 0 stays: a full restart is always possible
                self._ckpt_path(old).unlink(missing_ok=True)

    def _restore(self, step: int) -> None:
        from modelward.core.io import load_metadata

        self._ckpt_join()
        path = self._ckpt_path(step)
        if not path.is_file():
            raise PartyError(f"party {self.cfg.name} has no checkpoint at step {step} (has {self.checkpoints()})")
        tensors = load_tensors(path)
        meta = json.loads(load_metadata(path).get("modelward", "{}"))
        self.segment.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
        self.step = int(meta["step"])
        self.pending = None
        if "train_cfg" in meta:
            self.train_cfg = TrainConfig.model_validate(meta["train_cfg"])
            self.opt = make_optimizer(list(self.params.values()), self.train_cfg)
            optimizer_from_tensors(self.opt, {k: v for k, v in tensors.items() if k.startswith("opt.")}, meta["opt"])
        elif self.opt is not None and self.train_cfg is not None:
            self.opt = make_optimizer(list(self.params.values()), self.train_cfg)  # fresh state, as at step 0

    def state_digest(self) -> str:
        """sha256 over parameters, buffers and optimizer state: equal digests = bit-identical state."""
        tensors, _ = self._state_tensors()
        return _digest(tensors)

    # ----------------------------------------------------------------- request handling
    def handle(self, caller: str, data: bytes) -> bytes:
        """Decode, check sequence and consent, dispatch, audit. Raises ModelwardError subclasses on refusal."""
        msg = decode(data, max_bytes=int(self.cfg.max_message_mb * 2**20))
        shapes = {k: list(v.shape) for k, v in msg.tensors.items()}
        purpose = str(msg.meta.get("purpose", ""))
        batch = max((v.shape[0] for v in msg.tensors.values() if v.dim()), default=0)
        with self.lock:
            peer = self.consent.check_peer(caller)
            if not peer.allowed:
                self.audit.append(caller, msg.op, msg.session, msg.step, msg.seq, batch, shapes, "deny", peer.reason)
                raise ConsentDenied(f"party {self.cfg.name}: {peer.reason}")
            if msg.op in ("status", "open"):
                out = self._status() if msg.op == "status" else self._open(msg)
                self.audit.append(caller, msg.op, msg.session, msg.step, msg.seq, 0, {}, "allow", "")
                return encode(Message(msg.op, msg.session, self.step, msg.seq, out))
            # the request itself is the retry key: an identical retry is recognised by comparing bytes, so the
            # normal path hashes nothing (the guard keeps only the last request per session)
            key = bytes(data)
            try:
                cached = self.guard.check(msg.session, msg.seq, key)
            except WireError as e:
                self.audit.append(caller, msg.op, msg.session, msg.step, msg.seq, batch, shapes, "deny", str(e))
                raise
            if cached is not None:
                self.audit.append(caller, msg.op, msg.session, msg.step, msg.seq, batch, shapes, "retry",
                                  "answered from cache")
                return cached
            if msg.op not in ("forward", "backward", "loss_backward", "restore", "checkpoint"):
                raise WireError(f"unknown operation {msg.op!r}; valid: status, open, forward, backward, "
                                "loss_backward, restore, checkpoint")
            if msg.op in ("restore", "checkpoint"):
                purpose, batch = "train", 0  # state changes of a training session: need training consent
            req = PassRequest(self.cfg.name, caller, msg.op, purpose or "train", msg.session, msg.step, batch)
            decision = self.consent.check(req)
            if not decision.allowed:
                self.audit.append(caller, msg.op, msg.session, msg.step, msg.seq, batch, shapes, "deny",
                                  decision.reason)
                raise ConsentDenied(f"party {self.cfg.name} refused {msg.op} (step {msg.step}): {decision.reason}")
            try:
                self._raise_ckpt_error()
                reply = getattr(self, f"_op_{msg.op}")(msg)
            except (ModelwardError, RuntimeError, ValueError) as e:
                reason = str(e) if isinstance(e, ModelwardError) else f"{type(e).__name__}: {e}"
                self.audit.append(caller, msg.op, msg.session, msg.step, msg.seq, batch, shapes, "error", reason)
                if isinstance(e, ModelwardError):
                    raise
                raise PartyError(f"party {self.cfg.name}: {msg.op} failed: {reason}") from None
            reply.session, reply.seq = msg.session, msg.seq
            out_bytes = encode(reply)
            self.audit.append(caller, msg.op, msg.session, msg.step, msg.seq, batch, shapes, "allow",
                              decision.reason)
            self.guard.commit(msg.session, msg.seq, key, out_bytes)
            return out_bytes

    def _status(self) -> dict[str, Any]:
        return {"party": self.cfg.name, "layers": self.cfg.layers, "all_layers": self.all_layers,
                "first": self.is_first, "last": self.is_last, "step": self.step,
                "in_shape": list(self.in_shape), "out_shape": list(self.out_shape),
                "n_train": self._n("train"), "n_test": self._n("test"),
                "pending": self.pending is not None, "checkpoints": self.checkpoints(), "digest": self.state_digest(), "audit_head": self.audit.head,
                "params": {k: list(v.shape) for k, v in self.params.items()},
                "train_cfg": self.train_cfg.model_dump(mode="json") if self.train_cfg else None}

    def _n(self, split: str) -> int | None:
        src = getattr(self, f"x_{split}") if self.is_first else getattr(self, f"y_{split}")
        return None if src is None else len(src)

    def _open(self, msg: Message) -> dict[str, Any]:
        """Start or rejoin a session; a training session fixes the optimizer configuration."""
        tc = msg.meta.get("train_cfg")
        if tc is not None:
            cfg = validate(TrainConfig, tc, "train_cfg")
            if self.train_cfg is None:
                self.train_cfg = cfg
                self.opt = make_optimizer(list(self.params.values()), cfg)
            elif _opt_fields(self.train_cfg) != _opt_fields(cfg):
                raise PartyError(f"party {self.cfg.name} is already training with a different optimizer "
                                 f"configuration {_opt_fields(self.train_cfg)}; use a fresh checkpoint_dir to "
                                 "start over")
            n_test = self._n("test")
            ev = min(cfg.eval_batch_size, n_test) if n_test else cfg.eval_batch_size
            self._warm_up([cfg.batch_size, ev] + ([n_test % ev] if n_test and n_test % ev else []))
        self.guard.restore(msg.session, self.audit.last_seq(msg.session))
        return {**self._status(), "last_seq": self.guard.last_seq(msg.session)}

    def _warm_up(self, batch_sizes: list[int]) -> None:
        """Run forward and backward once per batch size on a throw-away copy of the segment (zeros in, RNG state
        kept), so that torch's one-time kernel set-up for these shapes happens when a session opens rather than
        inside the first training steps. The party's parameters, buffers and optimizer state are not touched."""
        sizes = sorted({min(b, self.cfg.max_batch) for b in batch_sizes} - self._warm)
        if not sizes:
            return
        seg = copy.deepcopy(self.segment)
        with torch.random.fork_rng(devices=[]):
            for b in sizes:
                x = torch.zeros(b, *self.in_shape)
                seg.train()
                inp = _layout(x).requires_grad_(not self.is_first)
                seg(inp).sum().backward()
                seg.eval()
                with torch.no_grad():
                    seg(_layout(x))
                self._warm.add(b)

    def _check_step(self, msg: Message) -> None:
        if msg.step != self.step:
            raise PartyError(f"party {self.cfg.name} is at step {self.step}, request is for step {msg.step} "
                             "(resume from a common checkpoint with restore)")

    def _input(self, msg: Message, purpose: str) -> torch.Tensor:
        limit = min(self.cfg.max_batch, self.cfg.policy.max_batch or self.cfg.max_batch)
        if self.is_first:
            if "x" in msg.tensors and purpose == "predict":
                return expect(msg, "x", torch.float32, (None, *self.in_shape), limit)
            idx = expect(msg, "idx", torch.int64, (None,), limit)
            split = msg.meta.get("split", "train")
            src = {"train": self.x_train, "test": self.x_test}.get(split)
            if src is None:
                raise WireError(f"meta.split {split!r}: valid choices: train, test")
            if len(idx) == 0 or int(idx.min()) < 0 or int(idx.max()) >= len(src):
                raise WireError(f"indices out of range [0, {len(src)}) for split {split!r}")
            return src[idx]
        return expect(msg, "h", torch.float32, (None, *self.in_shape), limit)

    def _labels(self, msg: Message, n: int) -> torch.Tensor:
        idx = expect(msg, "idx", torch.int64, (n,))
        split = msg.meta.get("split", "train")
        src = {"train": self.y_train, "test": self.y_test}.get(split)
        if src is None:
            raise WireError(f"meta.split {split!r}: valid choices: train, test")
        if int(idx.min()) < 0 or int(idx.max()) >= len(src):
            raise WireError(f"label indices out of range [0, {len(src)}) for split {split!r}")
        return src[idx]

    def _op_forward(self, msg: Message) -> Message:
        purpose = msg.meta.get("purpose", "train")
        x = self._input(msg, purpose)
        if purpose == "train":
            if self.is_last:
                raise PartyError("the last party trains through loss_backward, not forward")
            if self.opt is None:
                raise PartyError(f"party {self.cfg.name}: open a training session first")
            self._check_step(msg)
            if self.pending is not None and self.pending.step == self.step and torch.equal(self.pending.x, x):
                return Message("forward", step=self.step, tensors={"h": self.pending.out.detach()})
            if self.pending is not None and self.pending.step == self.step:
                raise PartyError(f"party {self.cfg.name}: a different forward for step {self.step} is pending "
                                 "(restore to a checkpoint to start the step over)")
            inp = None if self.is_first else _layout(x).requires_grad_(True)
            self.segment.train()
            out = self.segment(_layout(x) if inp is None else inp)
            self.pending = _Pending(self.step, inp, out, x)
            return Message("forward", step=self.step, tensors={"h": out.detach()})
        if purpose not in ("eval", "predict"):
            raise WireError(f"meta.purpose {purpose!r}: valid choices: train, eval, predict")
        self.segment.eval()
        try:
            with torch.no_grad():
                out = self.segment(_layout(x))
        finally:
            self.segment.train()
        if not self.is_last:
            return Message("forward", step=self.step, tensors={"h": out})
        if purpose == "predict":
            return Message("forward", step=self.step, tensors={"logits": out})
        y = self._labels(msg, len(out))
        metric = msg.meta.get("metric", "error")
        if metric == "error":
            total = float((out.argmax(1) != y).sum().item())
        elif metric == "cross_entropy":
            total = float(F.cross_entropy(out, y, reduction="sum").item())
        else:
            raise WireError(f"meta.metric {metric!r}: valid choices: error, cross_entropy")
        return Message("forward", step=self.step, meta={"sum": total, "n": len(y)})

    def _set_lr(self) -> None:
        assert self.opt is not None and self.train_cfg is not None
        for g in self.opt.param_groups:
            g["lr"] = self.train_cfg.lr_at(self.step)

    def _commit_step(self) -> None:
        self.step += 1
        self.pending = None
        if self.step % self.cfg.checkpoint_every == 0:
            self._save_checkpoint(background=True)

    def _op_loss_backward(self, msg: Message) -> Message:
        if not self.is_last:
            raise PartyError(f"party {self.cfg.name} does not hold the labels; only the last party computes the loss")
        if self.opt is None:
            raise PartyError(f"party {self.cfg.name}: open a training session first")
        self._check_step(msg)
        h = self._input(msg, "train")
        y = self._labels(msg, len(h))
        inp = _layout(h).requires_grad_(not self.is_first)
        self.segment.train()
        loss = F.cross_entropy(self.segment(inp), y)
        self._set_lr()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        grad = inp.grad
        self._commit_step()
        return Message("loss_backward", step=msg.step, meta={"loss": float(loss.item())},
                       tensors={"g": grad} if grad is not None else {})

    def _op_backward(self, msg: Message) -> Message:
        if self.is_last:
            raise PartyError("the last party trains through loss_backward")
        self._check_step(msg)
        p = self.pending
        if p is None or p.step != self.step:
            raise PartyError(f"party {self.cfg.name}: no forward pending for step {self.step}")
        g = expect(msg, "g", torch.float32, tuple(p.out.shape))
        assert self.opt is not None
        self._set_lr()
        self.opt.zero_grad(set_to_none=True)
        p.out.backward(g.contiguous(memory_format=_format_of(p.out)))
        self.opt.step()
        grad = p.inp.grad if p.inp is not None else None
        self._commit_step()
        return Message("backward", step=msg.step, tensors={"g": grad} if grad is not None else {})

    def _op_restore(self, msg: Message) -> Message:
        self._restore(int(msg.meta.get("to_step", -1)))
        return Message("restore", step=self.step, meta={"step": self.step})

    def _op_checkpoint(self, msg: Message) -> Message:
        """Save a checkpoint now; with meta.export also write export.safetensors (parameters + buffers only) into
        this party's own checkpoint folder — nothing but the path leaves the party."""
        path = self._save_checkpoint()
        meta: dict[str, Any] = {"step": self.step, "path": str(path)}
        if msg.meta.get("export"):
            exp = self.ckpt_dir / "export.safetensors"
            save_tensors(exp, self.segment.state_dict(), {"modelward": json.dumps({"step": self.step,
                                                                                    "party": self.cfg.name})})
            meta["export"] = str(exp)
        return Message("checkpoint", step=self.step, meta=meta)


# --------------------------------------------------------------------- gRPC transport
_CODES = {ConsentDenied: grpc.StatusCode.PERMISSION_DENIED, WireError: grpc.StatusCode.INVALID_ARGUMENT,
          PartyError: grpc.StatusCode.FAILED_PRECONDITION}


def caller_identity(context: grpc.ServicerContext) -> str | None:
    names = context.auth_context().get("x509_common_name") or []
    return names[0].decode("utf-8", "replace") if names else None


class PartyServer:
    """gRPC server for one Party with mutual TLS: clients without a certificate from the configured CA never get
    past the handshake; clients with one are identified by the certificate's common name."""

    def __init__(self, party: Party, workers: int = 4) -> None:
        self.party = party
        cfg = party.cfg
        limit = int(cfg.max_message_mb * 2**20) + 65536
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers),
                                  options=[("grpc.max_receive_message_length", limit),
                                           ("grpc.max_send_message_length", limit),
                                           ("grpc.so_reuseport", 0)])
        handler = grpc.method_handlers_generic_handler(SERVICE, {"Call": grpc.unary_unary_rpc_method_handler(
            self._call)})
        self.server.add_generic_rpc_handlers((handler,))
        creds = grpc.ssl_server_credentials(
            [(read_pem(cfg.tls.key, "tls.key"), read_pem(cfg.tls.cert, "tls.cert"))],
            root_certificates=read_pem(cfg.tls.ca, "tls.ca"), require_client_auth=True)
        try:
            self.port = self.server.add_secure_port(f"{cfg.host}:{cfg.port}", creds)
        except RuntimeError:  # grpcio >= 1.60 raises instead of returning 0
            self.port = 0
        if self.port == 0:
            raise ConfigError(f"party {cfg.name}: cannot listen on {cfg.host}:{cfg.port}: the address is in use "
                              "(another party server?) or not local; set `port` (0 = any free port) or `host`")

    def _call(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        caller = caller_identity(context)
        if caller is None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "no client certificate")
        try:
            return self.party.handle(caller, request)
        except ModelwardError as e:
            code = next((c for t, c in _CODES.items() if isinstance(e, t)), grpc.StatusCode.INVALID_ARGUMENT)
            context.abort(code, str(e))
        except Exception as e:  # a bug must not take the party down; the state lock guarantees consistency
            context.abort(grpc.StatusCode.INTERNAL, f"party {self.party.cfg.name}: internal error "
                                                    f"{type(e).__name__}: {e}")
        raise AssertionError("unreachable")

    def start(self) -> int:
        self.server.start()
        return self.port

    def stop(self, grace: float = 5.0) -> None:
        self.server.stop(grace).wait()
        with self.party.lock:
            self.party.audit.close()


def describe(party: Party, port: int) -> str:
    c = party.cfg
    role = "first (inputs)" if party.is_first else "last (labels, loss)" if party.is_last else "middle"
    n = sum(p.numel() for p in party.params.values())
    pol = c.policy
    return (f"party {c.name}: listening on {c.host}:{port} (mutual TLS)\n"
            f"  layers {c.layers} of {party.all_layers} — role {role}, {n} parameters\n"
            f"  step {party.step}, checkpoints every {c.checkpoint_every} steps in {c.checkpoint_dir}\n"
            f"  audit log {c.audit_db} (head {party.audit.head[:16]}…)\n"
            f"  policy: peers {pol.allow_peers}, training={pol.training}, inference={pol.inference}, "
            f"max_batch={pol.max_batch}, max_steps_per_session={pol.max_steps_per_session}, "
            f"max_passes_per_day={pol.max_passes_per_day}, window={pol.window_utc}, "
            f"approval={pol.approval or pol.approval_command}")


def serve(cfg: PartyConfig, log=print, stop_event: threading.Event | None = None) -> None:
    """Run a party until SIGTERM/SIGINT (or `stop_event`); shut down gracefully, saving a checkpoint."""
    import signal

    party = Party(cfg)
    try:
        server = PartyServer(party)
    except BaseException:
        with party.lock:
            party.audit.close()
        raise
    port = server.start()
    log(describe(party, port))
    log(f"READY {cfg.name} {cfg.host}:{port}")
    stop = stop_event or threading.Event()

    def _handler(signum, _frame):
        log(f"party {cfg.name}: received {signal.Signals(signum).name}, shutting down")
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _handler)
        signal.signal(signal.SIGINT, _handler)
    while not stop.wait(0.2):
        pass
    server.server.stop(1.0).wait()
    with party.lock:
        if party.pending is None and party.step not in party.checkpoints():
            party._save_checkpoint()
        party.audit.close()
    log(f"party {cfg.name}: stopped at step {party.step}")
    time.sleep(0)
