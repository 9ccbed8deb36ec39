"""Wire format for tensors between parties: explicit dtype and shape, size limits, replay/order protection.

A message is ``MAGIC | u32 header length | JSON header | raw tensor bytes``. The header names the operation, the
session, the training step, a per-link sequence number, free JSON metadata, and for every tensor its name, dtype,
shape, byte count and memory layout (``"channels_last"`` for an image batch stored channels-last — the layout the
CPU convolutions produce and want — so that neither side converts it; row-major otherwise). Decoding checks everything before any byte is interpreted as a tensor and raises
:class:`WireError` (never anything else) on malformed, oversized or non-finite input.
"""

from __future__ import annotations

import json
import math
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from modelward.errors import ModelwardError

MAGIC = b"MWT1"
MAX_HEADER = 64 * 1024
MAX_NDIM = 8
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int64": torch.int64, "int32": torch.int32, "uint8": torch.uint8, "bool": torch.bool,
}
_NAMES = {v: k for k, v in DTYPES.items()}
_ITEMSIZE = {k: v.itemsize for k, v in DTYPES.items()}
_FLOATS = {"float32", "float64", "float16", "bfloat16"}


class WireError(ModelwardError):
    """A message is malformed, too large, non-finite, of the wrong shape/dtype, replayed or out of order."""


@dataclass
class Message:
    op: str
    session: str = ""
    step: int = 0
    seq: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


def _itemsize(dtype: str) -> int:
    return _ITEMSIZE[dtype]


def message_limit(rows: int, row_shapes: list[tuple[int, ...]], itemsize: int = 4) -> int:
    """The largest legitimate message for `rows` rows whose largest per-row tensors have `row_shapes` (plus an
    int64 index per row, the header and the framing): what a party's transport may buffer at most (issue 26: an
    oversized message is dropped by gRPC before it is buffered, whoever sent it).

    Args:
        rows: the most rows a message may carry (the party's ``max_batch`` and its policy's).
        row_shapes: every per-row shape a message may carry (an activation, a gradient, inputs, logits).
        itemsize: bytes per element (float32: 4).

    Returns:
        The limit in bytes.

    Example:
        >>> message_limit(512, [(16, 4, 4), (10,)])
        593936
    """
    widest = max((math.prod(s) for s in row_shapes), default=0)
    return rows * (widest * itemsize + 8) + MAX_HEADER + len(MAGIC) + 4 + 8


def encode(msg: Message) -> bytes:
    specs, blobs = [], []
    for name, t in msg.tensors.items():
        if t.dtype not in _NAMES:
            raise WireError(f"tensor {name!r}: dtype {t.dtype} cannot be sent; valid: {sorted(DTYPES)}")
        t = t.detach().cpu()
        spec = {"name": name, "dtype": _NAMES[t.dtype], "shape": list(t.shape)}
        if _is_channels_last(t):  # sent in its memory order (N, H, W, C): no conversion on either side
            t = t.permute(0, 2, 3, 1)
            spec["layout"] = "channels_last"
        t = t.contiguous()  # a no-op for the layouts above
        raw = t.reshape(-1).view(torch.uint8).numpy()  # a view: the join below is the only copy
        spec["nbytes"] = raw.nbytes
        specs.append(spec)
        blobs.append(raw)
    header = json.dumps({"op": msg.op, "session": msg.session, "step": msg.step, "seq": msg.seq,
                         "meta": msg.meta, "tensors": specs}, separators=(",", ":")).encode()
    return b"".join([MAGIC, struct.pack("<I", len(header)), header, *blobs])


def _is_channels_last(t: torch.Tensor) -> bool:
    """A 4-D tensor stored channels-last and not also row-major (as a 1-channel or 1×1 batch would be)."""
    return t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last)


def all_finite(t: torch.Tensor) -> bool:
    """True iff no element is NaN or ±Inf. A NaN or an infinity makes the sum non-finite, so a finite sum proves
    the check in one vectorised pass; a non-finite sum (which overflow can also cause) falls back to the exact
    elementwise test."""
    if math.isfinite(float(t.sum(dtype=torch.float64 if t.dtype == torch.float64 else torch.float32))):
        return True
    return bool(torch.isfinite(t).all())


def _int(h: dict, key: str) -> int:
    v = h.get(key, 0)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0 or v > 2**53:
        raise WireError(f"header field {key!r} must be a non-negative integer, got {v!r}")
    return v


def decode(data: bytes, max_bytes: int = 64 * 2**20, allow_nonfinite: bool = False) -> Message:
    """Parse and check a message; raises WireError with a clear reason on any problem."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireError("message is not bytes")
    try:
        view = memoryview(data).cast("B")  # no copy of the (possibly large) message
    except TypeError:
        raise WireError("message is not a contiguous byte buffer") from None
    if len(view) > max_bytes:
        raise WireError(f"message of {len(view)} bytes exceeds the limit of {max_bytes} bytes")
    if len(view) < 8 or bytes(view[:4]) != MAGIC:
        raise WireError("not a modelward wire message (bad magic)")
    (hlen,) = struct.unpack("<I", view[4:8])
    if hlen > MAX_HEADER or 8 + hlen > len(view):
        raise WireError(f"header length {hlen} is invalid (limit {MAX_HEADER}, message {len(view)} bytes)")
    try:
        h = json.loads(bytes(view[8 : 8 + hlen]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise WireError(f"header is not valid JSON ({type(e).__name__})") from None
    if not isinstance(h, dict):
        raise WireError("header must be a JSON object")
    op, session, meta, specs = h.get("op"), h.get("session", ""), h.get("meta", {}), h.get("tensors", [])
    if not isinstance(op, str) or not op or len(op) > 64:
        raise WireError("header field 'op' must be a short non-empty string")
    if not isinstance(session, str) or len(session) > 128:
        raise WireError("header field 'session' must be a string of at most 128 characters")
    if not isinstance(meta, dict):
        raise WireError("header field 'meta' must be an object")
    if not isinstance(specs, list) or len(specs) > 16:
        raise WireError("header field 'tensors' must be a list of at most 16 tensor specs")
    msg = Message(op, session, _int(h, "step"), _int(h, "seq"), meta)
    offset = 8 + hlen
    for spec in specs:
        if not isinstance(spec, dict):
            raise WireError("tensor spec must be an object")
        name, dtype, shape, nbytes = spec.get("name"), spec.get("dtype"), spec.get("shape"), spec.get("nbytes")
        if not isinstance(name, str) or not name or len(name) > 64 or name in msg.tensors:
            raise WireError(f"tensor name {name!r} is invalid or repeated")
        if dtype not in DTYPES:
            raise WireError(f"tensor {name!r}: dtype {dtype!r} not allowed; valid: {sorted(DTYPES)}")
        if (not isinstance(shape, list) or len(shape) > MAX_NDIM
                or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= 2**31 for d in shape)):
            raise WireError(f"tensor {name!r}: shape must be a list of at most {MAX_NDIM} non-negative ints")
        layout = spec.get("layout", "contiguous")
        if layout not in ("contiguous", "channels_last") or (layout == "channels_last" and len(shape) != 4):
            raise WireError(f"tensor {name!r}: layout {layout!r} invalid; valid: contiguous, channels_last "
                            "(4-D only)")
        expected = math.prod(shape) * _itemsize(dtype)
        if nbytes != expected:
            raise WireError(f"tensor {name!r}: {nbytes!r} bytes declared, {dtype}{shape} needs {expected}")
        if offset + expected > len(view):
            raise WireError(f"tensor {name!r}: truncated message ({len(view) - offset} of {expected} bytes)")
        if expected:
            # one copy, straight from the received buffer into memory the tensor owns
            buf = bytearray(view[offset : offset + expected])
            t = torch.frombuffer(buf, dtype=torch.uint8).view(DTYPES[dtype])
            if layout == "channels_last":  # (N, H, W, C) in memory, seen as (N, C, H, W)
                n, c, h, w = shape
                t = t.reshape(n, h, w, c).permute(0, 3, 1, 2)
            else:
                t = t.reshape(shape)
        else:
            t = torch.empty(shape, dtype=DTYPES[dtype])
        offset += expected
        if dtype in _FLOATS and not allow_nonfinite and t.numel() and not all_finite(t):
            raise WireError(f"tensor {name!r} contains NaN or Inf")
        msg.tensors[name] = t
    if offset != len(view):
        raise WireError(f"{len(view) - offset} trailing bytes after the declared tensors")
    return msg


def expect(msg: Message, name: str, dtype: torch.dtype | None = None, shape: tuple[int | None, ...] | None = None,
           max_batch: int | None = None) -> torch.Tensor:
    """Fetch tensor `name`, checking dtype and shape (None = any size in that dimension)."""
    if name not in msg.tensors:
        raise WireError(f"{msg.op}: missing tensor {name!r} (has {sorted(msg.tensors)})")
    t = msg.tensors[name]
    if dtype is not None and t.dtype != dtype:
        raise WireError(f"{msg.op}: tensor {name!r} has dtype {_NAMES.get(t.dtype, t.dtype)}, "
                        f"expected {_NAMES.get(dtype, dtype)}")
    if shape is not None:
        if len(shape) != t.dim() or any(s is not None and s != d for s, d in zip(shape, t.shape, strict=True)):
            want = "×".join("B" if s is None else str(s) for s in shape)
            raise WireError(f"{msg.op}: tensor {name!r} has shape {list(t.shape)}, expected {want}")
    if max_batch is not None and t.dim() and t.shape[0] > max_batch:
        raise WireError(f"{msg.op}: batch of {t.shape[0]} exceeds the limit of {max_batch}")
    return t


class SequenceGuard:
    """Per-(peer, session) sequence numbers. A request must carry last+1. An exact repeat of the last successful
    request (same number, same bytes) is a retry and gets the cached response; anything else at or below the last
    number is a replay and anything above last+1 is out of order. Only successful requests advance the counter.

    Bounded: at most `max_sessions` sessions per peer are kept in memory (least recently used first out, with
    their one cached reply); a session that comes back is restored from `restore(peer, session)` (the audit log),
    so eviction never lets an old number be replayed.
    """

    def __init__(self, max_sessions: int = 8,
                 restore: Callable[[str, str], int] | None = None) -> None:
        self.max_sessions = max_sessions
        self.restore_fn = restore or (lambda peer, session: 0)
        self.last: dict[str, OrderedDict[str, tuple[int, bytes, bytes]]] = {}

    def _entry(self, peer: str, session: str) -> tuple[int, bytes, bytes]:
        sessions = self.last.setdefault(peer, OrderedDict())
        if session in sessions:
            sessions.move_to_end(session)
            return sessions[session]
        entry = (int(self.restore_fn(peer, session)), b"", b"")
        sessions[session] = entry
        while len(sessions) > self.max_sessions:
            sessions.popitem(last=False)
        return entry

    def check(self, peer: str, session: str, seq: int, request: bytes) -> bytes | None:
        """The cached response if this is a retry, else None; raises WireError on replay or a gap."""
        seen, d, resp = self._entry(peer, session)
        if seen and seq == seen and request == d and resp:
            return resp
        if seq <= seen:
            raise WireError(f"replayed message: sequence number {seq} already used in session {session!r} "
                            f"(last {seen})")
        if seq != seen + 1:
            raise WireError(f"out-of-order message: sequence number {seq} in session {session!r}, "
                            f"expected {seen + 1}")
        return None

    def commit(self, peer: str, session: str, seq: int, request: bytes, response: bytes) -> None:
        self._entry(peer, session)
        self.last[peer][session] = (seq, request, response)

    def last_seq(self, peer: str, session: str) -> int:
        return self._entry(peer, session)[0]


class InOrder:
    """Lets a caller pipeline its sequenced requests: one that arrives ahead of its predecessor (the transport
    hands concurrent requests to worker threads in any order) waits until the request numbered just before it was
    accepted, or refused, then meets the :class:`SequenceGuard` as usual (which still refuses gaps and replays).
    Only a (peer, session) with a finished request is waited for, at most `max_waiting` requests wait at once (any
    more go straight on) and none waits longer than `wait_s`; so a peer can hold at most `max_waiting` worker
    threads for `wait_s` seconds, and nothing it sends changes what is accepted. A refused request releases only
    the one numbered right after it (a request far ahead, refused, releases nobody).

    Example:
        >>> order = InOrder()
        >>> order.finished("driver", "s1", 1, accepted=1)
        >>> order.wait("driver", "s1", 2)  # its predecessor was accepted: no wait
    """

    def __init__(self, max_waiting: int = 2, wait_s: float = 2.0, max_keys: int = 64) -> None:
        self.max_waiting, self.wait_s, self.max_keys = max_waiting, wait_s, max_keys
        # (peer, session) -> (the last number the guard accepted, the last number refused)
        self._state: OrderedDict[tuple[str, str], tuple[int, int]] = OrderedDict()
        self._waiting = 0
        self._cv = threading.Condition()

    def _through(self, key: tuple[str, str], seq: int) -> bool:
        st = self._state.get(key)
        return st is None or st[0] >= seq - 1 or st[1] == seq - 1

    def wait(self, peer: str, session: str, seq: int) -> None:
        """Return once request `seq - 1` of (peer, session) was accepted or refused (or at once, see the class
        doc)."""
        key = (peer, session)
        with self._cv:
            if self._through(key, seq) or self._waiting >= self.max_waiting:
                return
            self._waiting += 1
            try:
                deadline = time.monotonic() + self.wait_s
                while not self._through(key, seq) and (left := deadline - time.monotonic()) > 0:
                    self._cv.wait(left)
            finally:
                self._waiting -= 1

    @contextmanager
    def turn(self, peer: str, session: str, seq: int, accepted: Callable[[], int]) -> Iterator[None]:
        """Wait for the turn of request `seq` (:meth:`wait`); on leaving, however it ends, record it with
        `accepted()`, the last number the sequence guard has accepted by then."""
        self.wait(peer, session, seq)
        try:
            yield
        finally:
            self.finished(peer, session, seq, accepted())

    def finished(self, peer: str, session: str, seq: int, accepted: int) -> None:
        """Request `seq` of (peer, session) is done; `accepted`: the guard's last accepted number now (`seq` if
        this one was accepted). Wakes the request waiting for it."""
        key = (peer, session)
        with self._cv:
            refused = self._state.get(key, (0, -1))[1]
            self._state[key] = (accepted, seq if accepted < seq else refused)
            self._state.move_to_end(key)
            while len(self._state) > self.max_keys:
                self._state.popitem(last=False)
            self._cv.notify_all()
