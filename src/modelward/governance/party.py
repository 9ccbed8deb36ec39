"""A party of a split model: the transport-free state machine (issue 10; seed 000 §1).

A party holds one contiguous segment of the model, its optimizer state and its own data column (inputs for the
first party, labels for the last). Tensors travel only between neighbours, peer to peer:

    driver --step(s, idx)--> P0 --step(s, h0, idx)--> P1 … --> P[n-1]  (loss from its labels, backward)
    driver <---- loss ------ P0 <-------- g0 -------- P1 … <-- g[n-2]

Each party consents to step s (forward *and* backward) when the step reaches it, before computing; it then
computes its gradients, applies its optimizer step *tentatively* (the state before the step is kept) and checks
the result. Only when every party consented and checked does step s commit anywhere; any refusal or failure
anywhere leads to ``abort(s)``, which restores parameters, optimizer state and BatchNorm statistics bit for bit
(two-phase commit with the driver as coordinator). A party answers its caller before its own update (weight
gradients, optimizer step, check) is done, so that it runs while the parties before it compute; its vote comes
with the next request (see :meth:`Party._op_step`). Evaluation and prediction travel the same chain, so every
party, the label holder included, consents to every pass; prediction logits stay with the label holder until the
driver fetches them. The driver thus sees batch indices, losses and metrics — never an activation or a gradient.

Consent is decided from the operation the party executes (:data:`consent.OP_PURPOSE`), never from a field the
caller sends. Who may ask for what is fixed by the chain: data operations (step, eval, predict) come from the
previous party (the driver for the first party), control operations from the driver. Every decision goes into the
hash-chained audit log together with the other parties' latest heads (cross-anchoring).
"""

from __future__ import annotations

import copy
import functools
import json
import math
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from modelward.core.config import validate
from modelward.core.data import load_data
from modelward.core.init import init_model_
from modelward.core.io import load_tensors, optimizer_from_tensors, optimizer_to_tensors, save_tensors
from modelward.core.process import idle_priority
from modelward.core.train import TrainConfig, make_optimizer
from modelward.core.zoo import build_model
from modelward.errors import ConfigError, ModelwardError
from modelward.governance.audit import AuditLog
from modelward.governance.backward import input_gradient
from modelward.governance.checkpoints import Checkpoints, state_digest
from modelward.governance.client import (
    ConsentDenied,
    GrpcPartyClient,
    NumericError,
    PartyClient,
    PartyError,
    PartyUnavailable,
    StepRolledBack,
)
from modelward.governance.config import (  # noqa: F401 - re-exported for callers of the old single module
    PartyConfig,
    TLSConfig,
    _resolve,
    load_party_config,
    pins,
    resolve_paths,
)
from modelward.governance.consent import ConsentChecker, PassRequest, purpose_of
from modelward.governance.plan import check_segment, model_layers, run_ops, segment_of
from modelward.governance.wire import InOrder, Message, SequenceGuard, WireError, decode, encode, expect

DATA_OPS = ("step", "eval", "predict")  # sequenced; from the previous party (the driver for the first)
CONTROL_OPS = ("open", "status", "vote", "commit", "abort", "restore", "checkpoint", "fetch")  # from the driver
OPS = DATA_OPS + CONTROL_OPS
MAX_RESULTS = 16  # prediction results kept for the driver to fetch (oldest dropped)


def _layout(x: torch.Tensor) -> torch.Tensor:
    """An input in the layout the CPU convolution kernels are fastest with: channels-last for image batches, as
    is for anything else. Values are unchanged; only the memory order differs. `x` must be the party's own
    tensor (decoded from a message, or indexed from its data): one already in that layout is used as it is,
    anything else is copied."""
    if x.dim() == 4 and x.is_floating_point():
        if _format_of(x) is torch.channels_last:  # strides exactly channels-last (what the kernels look at)
            return x
        return x.clone(memory_format=torch.channels_last)
    return x


def _format_of(t: torch.Tensor) -> torch.memory_format:
    if t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def _opt_fields(tc: TrainConfig) -> dict[str, Any]:
    """What fixes a party's parameter trajectory (run length and evaluation cadence may change between runs)."""
    return tc.model_dump(mode="json", include={"optimizer", "lr", "momentum", "weight_decay", "lr_schedule"})


def _max_abs(t: torch.Tensor) -> float:
    """max |t| (NaN if any element is NaN, inf if any is infinite) in one pass, without a temporary |t|."""
    if t.numel() == 0:
        return 0.0
    t = t.detach()
    if t.dim() == 4 and _format_of(t) is torch.channels_last:
        # the same elements in memory order (a view): the reduction over a channels-last tensor is ~9x slower
        # than over contiguous memory (0.17 vs 0.02 ms for a 128x64x4x4 activation)
        t = t.permute(0, 2, 3, 1).reshape(-1)
    lo, hi = torch.aminmax(t)  # both NaN if any element is
    lo, hi = float(lo), float(hi)
    return float("nan") if math.isnan(hi) or math.isnan(lo) else max(-lo, hi)


@dataclass
class _Prepared:
    """A step applied tentatively: the state before it, to restore bit for bit on abort."""

    step: int
    model: dict[str, torch.Tensor]
    opt: dict[str, Any]


@dataclass
class _Late:
    """The late part of a prepared step running on the update thread, and the request it belongs to (for the
    audit record of a failed check)."""

    future: Future
    snapshot: Callable[[], _Prepared]
    caller: str
    session: str
    seq: int


class Party:
    """The state machine of one party (no transport). ``handle(caller, bytes) -> bytes`` is the only entry point;
    `caller` is the pinned peer name the transport identified (before anything was decoded).

    Args:
        cfg: the party's configuration (paths resolved).
        connect: how to reach the next party: ``connect(name, address) -> PartyClient`` (default: gRPC + mTLS
            with this party's certificate, the next party pinned by its fingerprint).
    """

    def __init__(self, cfg: PartyConfig, connect: Any = None) -> None:
        from modelward.governance.identity import normalize_pins

        self.cfg = cfg
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.pins = normalize_pins(pins(cfg), f"party {cfg.name}: peers")
        full = build_model(cfg.model, tuple(cfg.input_shape), cfg.num_classes)
        layers = model_layers(full)
        names = [lay.name for lay in layers]
        start, end = check_segment(names, cfg.layers, f"party {cfg.name}: layers")
        self.all_layers, self.is_first, self.is_last = names, start == 0, end == len(names)
        self._check_roles()
        with torch.no_grad():  # activation shapes at every cut, from a dry run of the structure (no data)
            full.eval()
            x = torch.zeros(2, *cfg.input_shape)
            shapes = [tuple(x.shape[1:])]
            for lay in layers:
                x = run_ops(full, lay.ops, x)
                shapes.append(tuple(x.shape[1:]))
        self.in_shape, self.out_shape = shapes[start], shapes[end]
        self._protect = self._label_protection()
        if cfg.init.checkpoint is None:
            # the party's own secret randomness: a 64-bit seed from the OS CSPRNG, used once and never stored
            # (init.test_seed, refused off loopback, is the test-only way to make it reproducible)
            seed = cfg.init.test_seed if cfg.init.test_seed is not None else secrets.randbits(63)
            init_model_(full, cfg.init.scheme, seed)
            del seed
        self.segment = segment_of(full, cfg.layers, f"party {cfg.name}")
        del full  # the other layers (random, never used) go out of scope here
        if cfg.init.checkpoint is not None:
            self._load_own(cfg.init.checkpoint)
        self.segment.train()
        self.params = dict(self.segment.named_parameters())
        self._grad_params = [p for p in self.params.values() if p.requires_grad]
        # parameters and buffers, detached views of the live storage (every update is in place): what a step
        # snapshots, restores and checks, without rebuilding state_dict() each time
        self._live = dict(self.segment.state_dict())
        self._param_keys = [k for k in self._live if k in self.params]
        self._buffer_keys = [k for k in self._live if k not in self.params]  # BatchNorm statistics and the like
        # copies the parameters for the rollback while the forward and backward passes run (_snapshot_start)
        self._copier = ThreadPoolExecutor(1, thread_name_prefix=f"snapshot-{cfg.name}")
        self._load_data()
        self.audit = AuditLog(cfg.audit_db, cfg.name)
        self.consent = ConsentChecker(cfg.policy, self.audit)
        self.guard = SequenceGuard(cfg.max_sessions_per_peer,
                                   lambda caller, session: self.audit.last_seq(session, caller, DATA_OPS))
        self.lock = threading.RLock()
        self._order = InOrder()
        self._warm: set[int] = set()
        self.ckpt = Checkpoints(cfg.checkpoint_dir, cfg.keep_checkpoints)
        self.step = 0
        self.train_cfg: TrainConfig | None = None
        self.opt: torch.optim.Optimizer | None = None
        self.prepared: _Prepared | None = None
        self._note = ""  # added to the reason of the request's audit record (a commit carried by a step)
        # reused rollback buffers, two sets (by step parity): while a step's commit waits for the parties after
        # this one, the next step's snapshot must not overwrite it
        self._backups: list[dict[str, torch.Tensor] | None] = [None, None]
        self._opt_backups: list[dict[tuple[int, str], torch.Tensor]] = [{}, {}]
        # the late part of the prepared step (weight gradients, optimizer step, check), running after the input
        # gradient went back to the previous party; every request waits for it first (_settle)
        # (at idle CPU priority by default: it has slack, while the transport and the other parties' work that run
        # meanwhile are the step's critical path; measured -9 % per run with the driver in its own process)
        self.update_priority = cfg.update_priority
        self._updater = ThreadPoolExecutor(1, thread_name_prefix=f"update-{cfg.name}",
                                           initializer=idle_priority if cfg.update_priority == "idle" else None)
        self._updater_normal: ThreadPoolExecutor | None = None  # after a starved late update (see _late_update)
        self._pending: _Late | None = None
        self._rolled_back: tuple[int, str] | None = None  # (step, reason) of a step whose late check failed
        self.results: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._connect = connect or self._grpc_connect
        self.next_address = cfg.peers[cfg.next].address if cfg.next else None
        self.next_client: PartyClient | None = None
        self.link_seq: dict[str, int] = {}  # session -> last sequence number used towards the next party
        # the first optimizer in a process imports a lot of torch; pay that before READY, not on the first request
        make_optimizer([torch.nn.Parameter(torch.zeros(1))], TrainConfig()).step()
        latest = self.ckpt.list()
        if latest:
            self._restore(latest[-1])
        else:
            self._save_checkpoint()

    # ----------------------------------------------------------------- setup
    def _check_roles(self) -> None:
        c = self.cfg
        if c.driver is None:
            raise ConfigError(f"party {c.name}: set driver = \"<name>\" (the pinned identity the driver uses)")
        if not self.is_first and c.prev is None:
            raise ConfigError(f"party {c.name}: holds {c.layers}, not the first layers; set prev = \"<name>\" (the "
                              "party that sends it activations)")
        if self.is_first and c.prev is not None:
            raise ConfigError(f"party {c.name}: holds the first layers (and the inputs); it has no prev")
        if not self.is_last and c.next is None:
            raise ConfigError(f"party {c.name}: holds {c.layers}, not the last layers; set next = \"<name>\"")
        if self.is_last and c.next is not None:
            raise ConfigError(f"party {c.name}: holds the last layers (and the labels); it has no next")

    def _label_protection(self) -> Any:
        """The label holder's gradient perturbation hook, ``governance.leakage.protect_gradient`` (lazy)."""
        if self.cfg.label_protection is None:
            return None
        if not self.is_last:
            raise ConfigError(f"party {self.cfg.name}: [label_protection] is for the label holder (the last party)")
        try:
            from modelward.governance.leakage import protect_gradient
        except ImportError as e:
            raise ConfigError(f"[label_protection] needs modelward.governance.leakage.protect_gradient ({e})") \
                from None
        try:  # a bad table fails at start-up, not at the first step
            g = torch.randn(8, *self.in_shape, generator=torch.Generator().manual_seed(0))
            protect_gradient(g, torch.arange(8) % 2, self.cfg.label_protection)
        except ModelwardError as e:
            raise ConfigError(f"party {self.cfg.name}: [label_protection]: {e}") from None
        return protect_gradient

    def _grpc_connect(self, name: str, address: str) -> PartyClient:
        return GrpcPartyClient(name, address, self.cfg.tls, self.pins[name], self.cfg.max_message_mb,
                               self.cfg.timeout_s)

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
        return self.ckpt.list()

    def _ckpt_path(self, step: int):
        return self.ckpt.path(step)

    def _state_tensors(self, buffers: dict[str, torch.Tensor] | None = None
                       ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors = {f"model.{k}": v for k, v in self.segment.state_dict().items()}
        if buffers is not None:  # the buffers of an earlier moment (see _commit)
            tensors.update({f"model.{k}": buffers[k] for k in self._buffer_keys})
        meta: dict[str, Any] = {"step": self.step, "party": self.cfg.name, "layers": self.cfg.layers}
        if self.opt is not None and self.train_cfg is not None:
            ot, skel = optimizer_to_tensors(self.opt)
            tensors.update(ot)
            meta["opt"] = skel
            meta["train_cfg"] = self.train_cfg.model_dump(mode="json")
        return tensors, meta

    def _save_checkpoint(self, background: bool = False, buffers: dict[str, torch.Tensor] | None = None):
        # the records of every step in this checkpoint are on stable storage before it is (a step's own record
        # may still be syncing in the background when the step commits; a power cut loses the in-memory state
        # too, and the party restarts from a checkpoint): the writer waits for the audit log's sync first
        tensors, meta = self._state_tensors(buffers)
        return self.ckpt.save(self.step, tensors, meta, background, before=self.audit.sync)

    def _restore(self, step: int) -> None:
        got = self.ckpt.load(step)
        if got is None:
            raise PartyError(f"party {self.cfg.name} has no checkpoint at step {step} (has {self.checkpoints()})")
        tensors, meta = got
        self.segment.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
        self.step = int(meta["step"])
        self.prepared = None
        self._rolled_back = None
        if "train_cfg" in meta:
            self.train_cfg = TrainConfig.model_validate(meta["train_cfg"])
            self.opt = make_optimizer(list(self.params.values()), self.train_cfg)
            optimizer_from_tensors(self.opt, {k: v for k, v in tensors.items() if k.startswith("opt.")}, meta["opt"])
        elif self.opt is not None and self.train_cfg is not None:
            self.opt = make_optimizer(list(self.params.values()), self.train_cfg)  # fresh state, as at step 0

    def state_digest(self) -> str:
        """sha256 over parameters, buffers and optimizer state: equal digests = bit-identical state."""
        with self.lock:
            self._settle()
            return state_digest(self._state_tensors()[0])

    # ----------------------------------------------------------------- request handling
    def _role_ok(self, caller: str, op: str) -> bool:
        if op in DATA_OPS:
            return caller == (self.cfg.prev if self.cfg.prev is not None else self.cfg.driver)
        if op in ("open", "status"):
            return caller in (self.cfg.driver, self.cfg.prev)
        return caller == self.cfg.driver

    def handle(self, caller: str, data: bytes) -> bytes:
        """Peer check, decode, role, sequence and consent checks, dispatch, audit. Raises ModelwardError
        subclasses on refusal (the transport maps them to status codes)."""
        every = self.cfg.audit_refusals_every_s
        peer = self.consent.check_peer(caller)
        if not peer.allowed:  # before a single byte of the body is interpreted
            self.audit.refusal(caller, "(undecoded)", peer.reason, every, batch=len(data))
            raise ConsentDenied(f"party {self.cfg.name}: {peer.reason}")
        try:
            # non-finite values are caught by the magnitude bound below (one pass instead of two)
            msg = decode(data, max_bytes=int(self.cfg.max_message_mb * 2**20), allow_nonfinite=True)
        except WireError as e:
            self.audit.refusal(caller, "(malformed)", str(e), every, batch=len(data))
            raise
        op = msg.op
        shapes = {k: list(v.shape) for k, v in msg.tensors.items()}
        batch = max((v.shape[0] for v in msg.tensors.values() if v.dim()), default=0)
        purpose = purpose_of("open_train" if op == "open" and msg.meta.get("train_cfg") is not None else op)
        rec = {"session": msg.session, "step": msg.step, "seq": msg.seq, "batch": batch, "shapes": shapes,
               "purpose": purpose, "anchors": self._anchors_in(msg)}
        if op not in OPS:
            self.audit.refusal(caller, "(unknown)", f"unknown operation {op[:64]!r}", every)
            raise WireError(f"unknown operation {op!r}; valid: {', '.join(OPS)}")
        # a caller that pipelines its data operations (the driver sends step s+1 before step s is answered) may
        # have them delivered out of order: the later one waits for its predecessor (bounded, see InOrder)
        turn = (self._order.turn(caller, msg.session, msg.seq, lambda: self._accepted(caller, msg.session))
                if op in DATA_OPS and self._role_ok(caller, op) else nullcontext())
        with turn, self.lock:
            self._settle()  # the late part of the prepared step is done (or rolled back) before anything else
            if not self._role_ok(caller, op):
                reason = (f"{caller!r} may not call {op} on {self.cfg.name} (data operations come from "
                          f"{self.cfg.prev or self.cfg.driver!r}, control operations from the driver "
                          f"{self.cfg.driver!r})")
                self.audit.append(caller, op, **rec, decision="deny", reason=reason)
                raise ConsentDenied(f"party {self.cfg.name}: {reason}")
            sequenced = op in DATA_OPS
            key = bytes(data)
            if sequenced:
                try:
                    cached = self.guard.check(caller, msg.session, msg.seq, key)
                except WireError as e:
                    self.audit.append(caller, op, **rec, decision="deny", reason=str(e))
                    raise
                if cached is not None:
                    self.audit.append(caller, op, **rec, decision="retry", reason="answered from cache")
                    return cached
            split = str(msg.meta.get("split", "train"))[:16] if op == "eval" else ""
            decision = self.consent.check(PassRequest(self.cfg.name, caller, op, purpose, msg.session, msg.step,
                                                      batch, split))
            if not decision.allowed:
                self.audit.append(caller, op, **rec, decision="deny", reason=decision.reason)
                raise ConsentDenied(f"party {self.cfg.name} refused {op} (step {msg.step}): {decision.reason}")
            self._note = ""
            try:
                err = self.ckpt.take_error()
                if err:
                    raise PartyError(f"party {self.cfg.name}: {err}")
                reply = getattr(self, f"_op_{op}")(msg, caller)
            except (ModelwardError, RuntimeError, ValueError) as e:
                reason = str(e) if isinstance(e, ModelwardError) else f"{type(e).__name__}: {e}"
                self.audit.append(caller, op, **rec, decision="error", reason=reason + self._note)
                if isinstance(e, ModelwardError):
                    raise
                raise PartyError(f"party {self.cfg.name}: {op} failed: {reason}") from None
            down = reply.meta.pop("_anchors", {})
            if down:
                rec["anchors"] = {**rec["anchors"], **down}
            # a data pass's record is written now (a crash of this process cannot lose it) and synced to stable
            # storage in the background, off the step's critical path; every checkpoint and every answer to a
            # control operation waits for it, so no saved state rests on a record a power cut could take away
            self.audit.append(caller, op, **rec, decision="allow", reason=decision.reason + self._note,
                              durable=op not in DATA_OPS)
            if op in DATA_OPS:  # our head (including this record) travels back along the chain
                reply.meta["anchors"] = {**down, self.cfg.name: self.audit.head_ref}
            else:  # and to the driver with every control answer (it publishes the last one it saw)
                reply.meta["audit_head"] = self.audit.head_ref
            reply.session, reply.seq = msg.session, msg.seq
            out = encode(reply)
            if sequenced:
                self.guard.commit(caller, msg.session, msg.seq, key, out)
            return out

    def _accepted(self, caller: str, session: str) -> int:
        with self.lock:
            return self.guard.last_seq(caller, session)

    def _anchors_in(self, msg: Message) -> dict[str, list]:
        """The other parties' heads carried by a data message ({party: [record id, hash]}), validated."""
        a = msg.meta.get("anchors")
        if not isinstance(a, dict) or len(a) > 64:
            return {}
        return {str(k)[:32]: [int(v[0]), str(v[1])[:64]] for k, v in a.items()
                if k != self.cfg.name and isinstance(v, list) and len(v) == 2 and isinstance(v[0], int)
                and not isinstance(v[0], bool) and isinstance(v[1], str)}

    def _status(self, digest: bool = False) -> dict[str, Any]:
        link = self.next_client.stats if self.next_client is not None else None
        return {"party": self.cfg.name, "layers": self.cfg.layers, "all_layers": self.all_layers,
                "first": self.is_first, "last": self.is_last, "prev": self.cfg.prev, "next": self.cfg.next,
                "step": self.step, "in_shape": list(self.in_shape), "out_shape": list(self.out_shape),
                "n_train": self._n("train"), "n_test": self._n("test"),
                "prepared": self.prepared.step if self.prepared is not None else None,
                "update_priority": self.update_priority,
                "checkpoints": self.checkpoints(), "audit_head": self.audit.head_ref,
                "digest": self.state_digest() if digest else None,
                "params": {k: list(v.shape) for k, v in self.params.items()},
                "link": None if link is None else {"to": self.cfg.next, "sent": link.sent,
                                                   "received": link.received, "raw": link.raw,
                                                   "seconds": link.seconds, "calls": link.calls},
                "train_cfg": self.train_cfg.model_dump(mode="json") if self.train_cfg else None}

    def _n(self, split: str) -> int | None:
        src = getattr(self, f"x_{split}") if self.is_first else getattr(self, f"y_{split}")
        return None if src is None else len(src)

    # ----------------------------------------------------------------- the next party
    def _next_call(self, msg: Message, meta: dict, tensors: dict[str, torch.Tensor]) -> Message:
        """The data operation `msg` continued to the next party (sequenced per session; the link re-opens after a
        failure). The heads of the parties before us, and ours, travel with it."""
        op, session, step = msg.op, msg.session, msg.step
        if self.next_address is None:
            raise PartyError(f"party {self.cfg.name}: the address of the next party {self.cfg.next!r} is unknown "
                             f"(set [peers.{self.cfg.next}] address, or open the session through the driver)")
        try:
            if self.next_client is None:
                self.next_client = self._connect(self.cfg.next, self.next_address)
            if session not in self.link_seq:
                st = self.next_client.call(Message("open", session))
                if len(self.link_seq) > 4 * self.cfg.max_sessions_per_peer:
                    self.link_seq.clear()
                self.link_seq[session] = int(st.meta["last_seq"])
            seq = self.link_seq[session] + 1
            meta = {**meta, "anchors": {**self._anchors_in(msg), self.cfg.name: self.audit.head_ref}}
            out = self.next_client.call(Message(op, session, step, seq, meta, tensors))
            self.link_seq[session] = seq
            return out
        except PartyUnavailable:
            self.link_seq.pop(session, None)
            raise

    # ----------------------------------------------------------------- operations
    def _op_status(self, msg: Message, caller: str) -> Message:
        return Message("status", step=self.step, meta=self._status(bool(msg.meta.get("digest"))))

    def _op_open(self, msg: Message, caller: str) -> Message:
        """Start or rejoin a session; a training session fixes the optimizer configuration. The driver may tell
        the party where its next neighbour listens (the neighbour is still pinned by fingerprint)."""
        tc = msg.meta.get("train_cfg")
        if tc is not None and caller != self.cfg.driver:
            raise ConsentDenied(f"party {self.cfg.name}: only the driver ({self.cfg.driver}) opens training sessions")
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
        addr = msg.meta.get("next_address")
        if addr is not None and caller == self.cfg.driver and self.cfg.next is not None \
                and self.cfg.peers[self.cfg.next].address is None and isinstance(addr, str) and len(addr) < 256:
            if addr != self.next_address and self.next_client is not None:
                self.next_client.close()
                self.next_client = None
            self.next_address = addr
        return Message("open", step=self.step,
                       meta={**self._status(), "last_seq": self.guard.last_seq(caller, msg.session)})

    def _warm_up(self, batch_sizes: list[int]) -> None:
        """Run forward and backward once per batch size on a throw-away copy of the segment (zeros in, RNG state
        kept), so that torch's one-time kernel set-up happens when a session opens rather than inside the first
        training steps. The party's parameters, buffers and optimizer state are not touched."""
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

    def _bounded(self, t: torch.Tensor, what: str) -> torch.Tensor:
        """Refuse an incoming float tensor with a non-finite value or a magnitude beyond max_abs_input."""
        m = _max_abs(t)
        if not m <= self.cfg.max_abs_input:  # also true for NaN
            raise NumericError(f"party {self.cfg.name}: incoming {what} has max |value| {m:.3g}, beyond "
                               f"max_abs_input = {self.cfg.max_abs_input:g} (or non-finite); refused, nothing "
                               "computed")
        return t

    def _idx(self, msg: Message, split: str, limit: int) -> torch.Tensor:
        idx = expect(msg, "idx", torch.int64, (None,), limit)
        n = None  # a middle party holds no data: the indices only travel on to the label holder
        if self.is_first:
            n = len(self.x_train if split == "train" else self.x_test)
        elif self.is_last:
            n = len(self.y_train if split == "train" else self.y_test)
        if len(idx) == 0:
            raise WireError("empty batch")
        if n is not None and (int(idx.min()) < 0 or int(idx.max()) >= n):
            raise WireError(f"indices out of range [0, {n}) for split {split!r}")
        return idx

    def _split(self, msg: Message) -> str:
        split = msg.meta.get("split", "train")
        if split not in ("train", "test"):
            raise WireError(f"meta.split {split!r}: valid choices: train, test")
        return split

    def _input(self, msg: Message, split: str, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(indices, this party's input): its own samples for the first party, the activation otherwise."""
        idx = self._idx(msg, split, limit)
        if self.is_first:
            return idx, (self.x_train if split == "train" else self.x_test)[idx]
        h = self._bounded(expect(msg, "h", torch.float32, (len(idx), *self.in_shape), limit), "activation h")
        return idx, h

    def _limit(self) -> int:
        return min(self.cfg.max_batch, self.cfg.policy.max_batch or self.cfg.max_batch)

    def _set_lr(self, step: int) -> None:
        assert self.opt is not None and self.train_cfg is not None
        for g in self.opt.param_groups:
            g["lr"] = self.train_cfg.lr_at(step)

    def _snapshot_start(self, step: int) -> Callable[[], _Prepared]:
        """Start copying the state before step `step` into buffers reused from step to step (one set per step
        parity): parameters, buffers (BatchNorm statistics) and the optimizer's per-parameter state and
        hyper-parameters. The buffers (which the forward pass updates) and the hyper-parameters are copied now;
        the parameters and the optimizer state, which nothing changes before ``opt.step()``, are copied by a
        helper thread while the forward and backward passes run. Returns the function that waits for the copy
        and gives the snapshot (call it before the update, and before any rollback)."""
        assert self.opt is not None
        live = self._live
        bk = self._backups[step % 2]
        if bk is None or list(bk) != list(live) or any(bk[k].shape != v.shape for k, v in live.items()):
            bk = self._backups[step % 2] = {k: torch.empty_like(v) for k, v in live.items()}
        opt_backup = self._opt_backups[step % 2]
        if self._buffer_keys:
            torch._foreach_copy_([bk[k] for k in self._buffer_keys], [live[k] for k in self._buffer_keys])
        dst: list[torch.Tensor] = [bk[k] for k in self._param_keys]
        src: list[torch.Tensor] = [live[k] for k in self._param_keys]
        opt_state: dict[int, dict[str, Any]] = {}
        for i, p in enumerate(self.params.values()):
            st = self.opt.state.get(p)
            if not st:
                continue
            saved: dict[str, Any] = {}
            for k, v in st.items():
                if torch.is_tensor(v):
                    buf = opt_backup.get((i, k))
                    if buf is None or buf.shape != v.shape or buf.dtype != v.dtype:
                        buf = opt_backup[(i, k)] = torch.empty_like(v)
                    dst.append(buf)
                    src.append(v)
                    saved[k] = buf
                else:
                    saved[k] = copy.deepcopy(v)
            opt_state[i] = saved
        groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in self.opt.param_groups]
        snap = _Prepared(step, bk, {"state": opt_state, "groups": groups})
        if not dst:
            return lambda: snap
        copying = self._copier.submit(torch._foreach_copy_, dst, src)

        def done() -> _Prepared:
            copying.result()
            return snap

        return done

    def _rollback(self, snap: _Prepared) -> None:
        """Back to the state before the step: parameters, buffers (BatchNorm statistics) and optimizer state."""
        assert self.opt is not None
        live = self._live
        with torch.no_grad():
            torch._foreach_copy_(list(live.values()), [snap.model[k] for k in live])
        params = list(self.params.values())
        self.opt.state.clear()
        for i, saved in snap.opt["state"].items():
            self.opt.state[params[i]] = {k: (v.clone() if torch.is_tensor(v) else copy.deepcopy(v))
                                         for k, v in saved.items()}
        for g, saved in zip(self.opt.param_groups, snap.opt["groups"], strict=True):
            g.update(copy.deepcopy(saved))
        self.opt.zero_grad(set_to_none=True)

    def _check_update(self, step: int) -> None:
        """After the tentative update: every parameter and buffer finite and within max_abs_param. One fused
        L2 norm per tensor bounds its largest entry (max |x| <= ||x||_2) and is non-finite iff an entry is; only
        when that bound is exceeded does the exact per-tensor search run (to decide, and to name the culprit)."""
        floats = [v for v in self._live.values() if v.is_floating_point() and v.numel()]
        if not floats:
            return
        m = float(torch.stack(torch._foreach_norm(floats)).max())
        if m <= self.cfg.max_abs_param:
            return
        for k, v in self._live.items():
            if v.is_floating_point():
                mk = _max_abs(v)
                if not mk <= self.cfg.max_abs_param:
                    raise NumericError(f"party {self.cfg.name}: the update of step {step} leaves {k} with max "
                                       f"|value| {mk:.3g} (limit max_abs_param = {self.cfg.max_abs_param:g}, or "
                                       "non-finite); the step is rolled back and refused")
        if not math.isfinite(m):
            raise NumericError(f"party {self.cfg.name}: the update of step {step} is not finite; rolled back")

    def _update(self, step: int, snapshot: Callable[[], _Prepared]) -> None:
        """The optimizer step on the gradients computed, then the check of its result."""
        assert self.opt is not None
        snapshot()  # the copy of the parameters is complete before they change
        self._set_lr(step)
        self.opt.step()
        self._check_update(step)

    def _late_update(self, step: int, weight_pass: Callable[[], None], snapshot: Callable[[], _Prepared]) -> None:
        """The late part of a step (update thread): the weight gradients, then the update and its check.

        At idle priority, a late part that took far longer than the CPU time it used (more than 4x, and over
        0.1 s) was starved by other work on the host: the next steps run theirs at normal priority."""
        wall, cpu = time.monotonic(), time.thread_time()
        try:
            weight_pass()
            self._update(step, snapshot)
        finally:
            wall, cpu = time.monotonic() - wall, time.thread_time() - cpu
            if self.update_priority == "idle" and wall > max(0.1, 4 * cpu):
                self.update_priority = (f"normal (the late part of step {step} took {wall:.2f} s for {cpu:.3f} s "
                                        "of CPU at idle priority)")

    def _late_pool(self) -> ThreadPoolExecutor:
        if self.update_priority == "idle" or self.cfg.update_priority == "normal":
            return self._updater
        if self._updater_normal is None:
            self._updater_normal = ThreadPoolExecutor(1, thread_name_prefix=f"update-{self.cfg.name}-normal")
        return self._updater_normal

    def _settle(self) -> None:
        """Wait for the late part of the prepared step. If its check failed, the step is rolled back (bit-identical)
        and recorded: this party refuses to commit it (vote, commit, or the next step carrying the commit), so the
        driver aborts it everywhere."""
        late, self._pending = self._pending, None
        if late is None:
            return
        try:
            late.future.result()
            return
        except BaseException as e:  # noqa: BLE001 - any failure of the update refuses the step
            reason = str(e) if isinstance(e, ModelwardError) else f"update failed: {type(e).__name__}: {e}"
        snap = late.snapshot()
        if "rolled back" not in reason:
            reason += f"; step {snap.step} rolled back"
        self._rollback(snap)
        self.prepared = None
        self._rolled_back = (snap.step, reason)
        self.audit.append(late.caller, "step", late.session, snap.step, late.seq, decision="error",
                          reason=f"{reason} (found by the check after the input gradient was sent; the step is "
                                 "refused)", purpose=purpose_of("step"))

    def _refuse_rolled_back(self, step: int) -> None:
        if self._rolled_back is not None and self._rolled_back[0] == step:
            raise StepRolledBack(self._rolled_back[1])

    def _op_step(self, msg: Message, caller: str) -> Message:
        """Phase 1 of training step s: forward, (the rest of the chain), backward, tentative optimizer step,
        check. The state before the step is kept until commit(s) or abort(s).

        Every party after the first answers as soon as its input gradient exists and runs the rest of its step on
        the update thread: weight gradients (:mod:`.backward`, nothing computed twice), optimizer step and check,
        while the parties before it finish their own backward passes. (The first party, whose caller waits for
        the loss only, runs its backward pass and update before answering: nothing would overlap them.) A
        party's vote on the step is late: every request first waits for that check (:meth:`_settle`), and
        a failed check rolls the step back and refuses its commit. The commit of step s-1 travels with step s
        (``meta.commit``): each party passes it on only after its own check passed, the last party commits it on
        arrival (every party has voted for it then), the others once the parties after them have answered. The
        driver's explicit commit is preceded by a ``vote`` round for the same reason."""
        if self.opt is None:
            raise PartyError(f"party {self.cfg.name}: open a training session first")
        carried, held = self._carried_commit(msg)
        at = self.step + (held is not None)
        if msg.step != at:
            raise PartyError(f"party {self.cfg.name} is at step {at}, request is for step {msg.step} "
                             "(resume from a common checkpoint with restore)")
        if self.prepared is not None and held is None:
            raise PartyError(f"party {self.cfg.name}: step {self.prepared.step} is prepared and neither committed "
                             "nor aborted")
        self._rolled_back = None
        idx, x = self._input(msg, "train", self._limit())
        snapshot = self._snapshot_start(msg.step)
        try:
            self.segment.train()
            inp = None if self.is_first else _layout(x).requires_grad_(True)
            out = self.segment(_layout(x) if inp is None else inp)
            self.opt.zero_grad(set_to_none=True)
            root_grad: torch.Tensor | None = None
            if self.is_last:
                root = F.cross_entropy(out, self.y_train[idx])
                loss, down = float(root.item()), {}
            else:
                r = self._next_call(msg, {} if carried is None else {"commit": carried},
                                    {"h": out.detach(), "idx": idx})
                if held is not None:  # every party after this one has committed it
                    self._commit(held, buffers=snapshot().model)
                    self._note = f"; committed step {held} (carried by this {msg.op})"
                    held = None
                g = self._bounded(expect(r, "g", torch.float32, tuple(out.shape)), "gradient g")
                root, root_grad = out, g.contiguous(memory_format=_format_of(out))
                loss, down = float(r.meta["loss"]), self._anchors_in(r)
            grad = None
            if inp is None:  # the first party: its whole backward pass is its own (it answers with the loss first)
                weight_pass = functools.partial(torch.autograd.backward, root, root_grad)
            else:  # only what the previous party waits for; the weight gradients follow on the update thread
                # (from the gradients the input pass recorded at the weights' branch points: nothing computed twice)
                (grad,), weights = input_gradient(root, [inp], self._grad_params, root_grad)
                weight_pass = weights.run
                if self._protect is not None:
                    grad = self._protect(grad, self.y_train[idx], self.cfg.label_protection, step=msg.step,
                                         index=idx)
        except BaseException:
            self._rollback(snapshot())  # the state before this step (a held commit stays prepared)
            raise
        self.prepared = snapshot()
        if inp is None:
            # the first party's caller (the driver) waits for nothing but the loss, and no party's work overlaps
            # this update (the next step starts with it): run it here, which saves the hand-over to the update
            # thread (measured -1.2 to -1.5 ms per step with the driver hosting this party, about even with the
            # driver in its own process). Its check is still this party's late vote, reported to the next request
            late: Future = Future()
            try:
                self._late_update(msg.step, weight_pass, snapshot)
                late.set_result(None)
            except BaseException as e:  # noqa: BLE001 - any failure of the update refuses the step (in _settle)
                late.set_exception(e)
        else:
            late = self._late_pool().submit(self._late_update, msg.step, weight_pass, snapshot)
        self._pending = _Late(late, snapshot, caller, msg.session, msg.seq)
        return Message("step", step=msg.step, meta={"loss": loss, "_anchors": down},
                       tensors={"g": grad} if grad is not None else {})

    def _carried_commit(self, msg: Message) -> tuple[int | None, int | None]:
        """The commit of the last step carried by a data operation (``meta.commit``; a step or an evaluation):
        after this party's own check passed (settled before any request), the last party commits it on arrival,
        the others hold it until the parties after them have answered (then every party has voted for it).
        Returns (carried step or None, held step or None)."""
        carried = msg.meta.get("commit")  # phase 2 of the previous step, carried by this one (saves a round trip)
        if carried is None:
            return None, None
        if not isinstance(carried, int) or isinstance(carried, bool):
            raise WireError(f"meta.commit must be a step number, got {carried!r}")
        self._refuse_rolled_back(carried)
        if not self.is_last and self.prepared is not None and self.prepared.step == carried:
            return carried, carried  # committed once the next party has answered
        self._commit(carried)
        self._note = f"; committed step {carried} (carried by this {msg.op})"  # in this request's record
        return carried, None

    def _op_vote(self, msg: Message, caller: str) -> Message:
        """Phase 1's last word on step s from this party, after its late check (waited for before any request):
        ``prepared`` (or ``committed`` already); a step the check rolled back is refused (StepRolledBack)."""
        self._refuse_rolled_back(msg.step)
        if self.prepared is not None and self.prepared.step == msg.step:
            vote = "prepared"
        elif self.prepared is None and self.step == msg.step + 1:
            vote = "committed"
        else:
            raise PartyError(f"party {self.cfg.name}: nothing prepared for step {msg.step} (at step {self.step}, "
                             f"prepared {self.prepared.step if self.prepared else None})")
        return Message("vote", step=self.step, meta={"vote": vote, "step": self.step})

    def _op_commit(self, msg: Message, caller: str) -> Message:
        """Phase 2: keep the prepared step s (idempotent: a repeated commit of the last step is a no-op)."""
        self._refuse_rolled_back(msg.step)
        self._commit(msg.step)
        return Message("commit", step=self.step, meta={"step": self.step})

    def _commit(self, s: int, buffers: dict[str, torch.Tensor] | None = None) -> None:
        """Keep the prepared step s. `buffers`: the buffers as they were after step s, where this step's forward
        pass has moved them since (a commit held during the next step); a checkpoint due now is of that state."""
        if self.prepared is not None and self.prepared.step == s:
            self.prepared = None
            self.step = s + 1
            if self.step % self.cfg.checkpoint_every == 0:
                self._save_checkpoint(background=True, buffers=buffers)
        elif not (self.prepared is None and self.step == s + 1):
            raise PartyError(f"party {self.cfg.name}: nothing prepared for step {s} (at step {self.step}, "
                             f"prepared {self.prepared.step if self.prepared else None})")

    def _op_abort(self, msg: Message, caller: str) -> Message:
        """Phase 2 on a refusal: restore the state before the prepared step s (no-op if nothing is prepared)."""
        if self.prepared is not None and self.prepared.step == msg.step:
            self._rollback(self.prepared)
            self.prepared = None
        if self._rolled_back is not None and self._rolled_back[0] == msg.step:
            self._rolled_back = None  # aborted everywhere now; the step may be run again
        return Message("abort", step=self.step, meta={"step": self.step})

    def _forward_eval(self, x: torch.Tensor) -> torch.Tensor:
        self.segment.eval()
        try:
            with torch.no_grad():
                return self.segment(_layout(x))
        finally:
            self.segment.train()

    def _op_eval(self, msg: Message, caller: str) -> Message:
        """A metric (sum over the batch) on the label holder's labels; only the number travels back.

        It may carry the commit of the last training step (``meta.commit``, handled as by a step: the evaluation
        then scores the state every party has voted for, and the driver saves its vote and commit rounds)."""
        split = self._split(msg)
        idx, x = self._input(msg, split, self._limit())
        carried, held = self._carried_commit(msg)
        out = self._forward_eval(x)
        if not self.is_last:
            meta = {"split": split, "metric": msg.meta.get("metric", "error")}
            r = self._next_call(msg, meta if carried is None else {**meta, "commit": carried}, {"h": out, "idx": idx})
            if held is not None:  # every party after this one has committed it
                self._commit(held)
                self._note = f"; committed step {held} (carried by this eval)"
            return Message("eval", meta={"sum": float(r.meta["sum"]), "n": int(r.meta["n"]),
                                         "_anchors": self._anchors_in(r)})
        y = (self.y_train if split == "train" else self.y_test)[idx]
        metric = msg.meta.get("metric", "error")
        if metric == "error":
            total = float((out.argmax(1) != y).sum().item())
        elif metric == "cross_entropy":
            total = float(F.cross_entropy(out, y, reduction="sum").item())
        else:
            raise WireError(f"meta.metric {metric!r}: valid choices: error, cross_entropy")
        return Message("eval", meta={"sum": total, "n": len(y)})

    def _op_predict(self, msg: Message, caller: str) -> Message:
        """Prediction through the chain. The first party takes indices of its samples (or, from the driver of
        its own organisation, inputs x); the label holder keeps the logits for the driver to fetch."""
        limit = self._limit()
        if self.is_first and "x" in msg.tensors:
            x = self._bounded(expect(msg, "x", torch.float32, (None, *self.in_shape), limit), "input x")
            idx = torch.arange(len(x))
        else:
            idx, x = self._input(msg, self._split(msg), limit)
        out = self._forward_eval(x)
        if not self.is_last:
            r = self._next_call(msg, {"split": msg.meta.get("split", "test")}, {"h": out, "idx": idx})
            return Message("predict", meta={"token": r.meta["token"], "n": int(r.meta["n"]),
                                            "_anchors": self._anchors_in(r)})
        token = secrets.token_hex(16)
        self.results[token] = out
        while len(self.results) > MAX_RESULTS:
            self.results.popitem(last=False)
        return Message("predict", meta={"token": token, "n": len(out)})

    def _op_fetch(self, msg: Message, caller: str) -> Message:
        """The driver collects prediction logits (once)."""
        out = self.results.pop(str(msg.meta.get("token", "")), None)
        if out is None:
            raise PartyError(f"party {self.cfg.name}: no prediction result with that token (fetched already, or "
                             f"dropped: at most {MAX_RESULTS} are kept)")
        return Message("fetch", tensors={"logits": out})

    def _op_restore(self, msg: Message, caller: str) -> Message:
        if self.prepared is not None:
            self._rollback(self.prepared)
            self.prepared = None
        self._restore(int(msg.meta.get("to_step", -1)))
        return Message("restore", step=self.step, meta={"step": self.step})

    def _op_checkpoint(self, msg: Message, caller: str) -> Message:
        """Save a checkpoint now; with meta.export also write export.safetensors (parameters + buffers only) into
        this party's own checkpoint folder — nothing but the path leaves the party."""
        if self.prepared is not None:
            raise PartyError(f"party {self.cfg.name}: step {self.prepared.step} is prepared; commit or abort first")
        path = self._save_checkpoint()
        meta: dict[str, Any] = {"step": self.step, "path": str(path)}
        if msg.meta.get("export"):
            exp = self.ckpt.dir / "export.safetensors"
            save_tensors(exp, self.segment.state_dict(), {"modelward": json.dumps({"step": self.step,
                                                                                    "party": self.cfg.name})})
            meta["export"] = str(exp)
        return Message("checkpoint", step=self.step, meta=meta)

    def close(self) -> None:
        with self.lock:
            for pool in (self._updater, self._updater_normal):  # a late update in flight finishes (its step
                if pool is not None:                            # stays prepared)
                    pool.shutdown()
            self._copier.shutdown()
            self.ckpt.close()
            if self.next_client is not None:
                self.next_client.close()
            self.audit.close()
