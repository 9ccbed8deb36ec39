"""Wire format for tensors between parties: explicit dtype and shape, size limits, replay/order protection.

A message is ``MAGIC | u32 header length | JSON header | raw tensor bytes``. The header names the operation, the
session, the training step, a per-link sequence number, free JSON metadata, and for every tensor its name, dtype,
shape, byte count and memory layout (``"channels_last"`` for an image batch stored channels-last — the layout the
CPU convolutions produce and want — so that neither side converts it; row-major otherwise). Decoding checks everything before any byte is interpreted as a tensor and raises
:class:`WireError` (never anything else) on malformed, oversized or non-finite input.

Opt-in compression (issue 27): a float32 tensor named in ``Message.codecs`` travels as a :class:`Codec` says —
``int8`` (absmax-scaled 8-bit integers, one float32 scale per row or per tensor; Dettmers 2016, "8-Bit
Approximations for Parallelism in Deep Learning"; optional stochastic rounding as in QSGD, Alistarh et al. 2017) or
``topk`` (the k largest-magnitude entries of each row as values + indices; Aji & Heafield 2017, "Sparse
Communication for Distributed Gradient Descent"; Lin et al. 2018, "Deep Gradient Compression"). Its spec names the
codec and its parameters; the receiver checks the compressed form (declared size, scales finite and
non-negative, int8 codes in [-127, 127], indices in range and distinct per row, the decoded size within the same
limit as the message) before it builds the dense tensor, which is what the party then sees and checks as usual.
A message without codecs is encoded exactly as before.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import secrets
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
CODECS = ("int8", "topk")


class WireError(ModelwardError):
    """A message is malformed, too large, non-finite, of the wrong shape/dtype, replayed or out of order."""


@dataclass(frozen=True)
class Codec:
    """How one float32 tensor of a message is sent compressed (``Message.codecs``); rows are the first dimension
    (a batch), a tensor of fewer than 2 dimensions is one row.

    Args:
        method: ``"int8"``: ``q = round(x / s)`` in [-127, 127] with ``s = max|x| / 127`` per row (or per tensor),
            decoded as ``q · s`` (error at most s/2 per entry; Dettmers 2016); with ``stochastic``,
            ``q = floor(x / s + u)``, ``u ~ U[0, 1)``, unbiased (E[q·s] = x) with error below s (QSGD, Alistarh et
            al. 2017). ``"topk"``: the ``k = ceil(ratio · columns)`` entries of largest magnitude of every row, as
            float32 values and int16/int32 column indices, the rest decoded as 0 (Aji & Heafield 2017; Lin et al.
            2018).
        scale: int8 only: ``"row"`` (one scale per row) or ``"tensor"``.
        stochastic: int8 only: stochastic rounding.
        ratio: topk only: the fraction of each row kept, in (0, 1].
        key: stochastic rounding's secret: the uniforms of tensor `name` in operation `op` of step `step` come from a
            generator seeded by HMAC(key, op:step:name), so a step aborted and run again sends the same codes
            (fresh noise each time could be averaged away). None: a random key per process.

    Example:
        >>> Codec("int8").describe([32, 1024]), Codec("topk", ratio=0.1).describe([32, 1024])
        ('int8/row', 'topk(k=103 of 1024)')
    """

    method: str
    scale: str = "row"
    stochastic: bool = False
    ratio: float = 0.1
    key: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.method not in CODECS:
            raise WireError(f"codec {self.method!r}: valid choices: {list(CODECS)}")
        if self.scale not in ("row", "tensor"):
            raise WireError(f"codec int8: scale {self.scale!r}; valid choices: row, tensor")
        if not 0.0 < self.ratio <= 1.0:
            raise WireError(f"codec topk: ratio {self.ratio!r} must be in (0, 1]")

    def k(self, cols: int) -> int:
        """topk: the entries kept per row of `cols` columns (at least one, at most all)."""
        return min(cols, max(1, math.ceil(self.ratio * cols))) if cols else 0

    def describe(self, shape: list[int] | tuple[int, ...]) -> str:
        """A short name of the codec for a tensor of `shape` (audit records, benchmark tables)."""
        if self.method == "int8":
            return f"int8/{self.scale}" + ("/stochastic" if self.stochastic else "")
        cols = _rows_cols(shape)[1]
        return f"topk(k={self.k(cols)} of {cols})"


@dataclass
class Message:
    """One message. `codecs` (sending side only, never encoded as such): tensors to send compressed;
    `received` (filled by :func:`decode`): how each compressed tensor arrived, ``{name: "int8/row 4.1 KiB"}``."""

    op: str
    session: str = ""
    step: int = 0
    seq: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    codecs: dict[str, Codec] = field(default_factory=dict)
    received: dict[str, str] = field(default_factory=dict)


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
        codec = msg.codecs.get(name)
        if codec is not None:
            spec, raw_parts = _compress_spec(name, t, codec, msg.op, msg.step)
            specs.append(spec)
            blobs.extend(raw_parts)
            continue
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


def _rows_cols(shape: list[int] | tuple[int, ...]) -> tuple[int, int]:
    """(rows, columns) of a tensor seen as a matrix: the first dimension is the rows (a batch); fewer than 2
    dimensions: one row."""
    if len(shape) >= 2:
        return int(shape[0]), math.prod(shape[1:])
    return 1, math.prod(shape)


def _index_dtype(cols: int) -> torch.dtype:
    """topk's column indices: int16 where they fit (rows of at most 32767 columns), int32 otherwise."""
    return torch.int16 if cols <= 32767 else torch.int32


def compressed_nbytes(shape: list[int] | tuple[int, ...], codec: Codec) -> int:
    """The bytes a float32 tensor of `shape` takes on the wire under `codec` (what :func:`decode` expects).

    Example:
        >>> compressed_nbytes([32, 1024], Codec("int8")), compressed_nbytes([32, 1024], Codec("topk", ratio=0.1))
        (32896, 19776)
    """
    rows, cols = _rows_cols(shape)
    if codec.method == "int8":
        return (rows if codec.scale == "row" else 1) * 4 + rows * cols
    k = codec.k(cols)
    return rows * k * (4 + _index_dtype(cols).itemsize)


def _uniforms(codec: Codec, shape: tuple[int, ...], op: str, step: int, name: str) -> torch.Tensor:
    """U[0, 1) for stochastic rounding from a generator keyed by (codec key, op, step, tensor name)."""
    key = codec.key if codec.key is not None else _process_key()
    digest = hmac.new(key, f"{op}:{int(step)}:{name}".encode(), hashlib.sha256).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
    return torch.rand(shape, generator=gen)


_KEY: list[bytes] = []


def _process_key() -> bytes:
    """This process's secret rounding key (drawn once from the OS CSPRNG, never stored)."""
    if not _KEY:
        _KEY.append(secrets.token_bytes(32))
    return _KEY[0]


def int8_quantize(x: torch.Tensor, per_row: bool = True, uniforms: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Absmax 8-bit quantization of a matrix `x` [rows, cols] (Dettmers 2016): ``s = max|x| / 127`` per row (or
    one for the tensor), ``q = round(x / s)`` (or ``floor(x / s + u)`` given `uniforms` u ~ U[0, 1): stochastic
    rounding, QSGD), clamped to [-127, 127].

    Args:
        x: float32 [rows, cols].
        per_row: one scale per row (else one for the whole tensor).
        uniforms: U[0, 1) of x's shape for stochastic rounding (None: round to nearest).

    Returns:
        ``(scales float32 [rows] or [1], codes int8 [rows, cols])``; decode with :func:`int8_dequantize`.

    Example:
        >>> s, q = int8_quantize(torch.tensor([[1.0, -0.5], [0.0, 0.0]]))
        >>> q.tolist(), int8_dequantize(s, q).tolist()
        ([[127, -64], [0, 0]], [[1.0, -0.5039370059967041], [0.0, 0.0]])
    """
    a = x.abs()
    if per_row:
        amax = a.amax(dim=1) if x.shape[1] else torch.zeros(x.shape[0])
    else:
        amax = a.amax().reshape(1) if x.numel() else torch.zeros(1)
    scale = (amax / 127.0).to(torch.float32)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    y = x / (safe[:, None] if per_row else safe)
    q = torch.floor(y.add_(uniforms)) if uniforms is not None else torch.round(y)
    return scale, q.clamp_(-127, 127).to(torch.int8)


def int8_dequantize(scale: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``q · s`` (float32 [rows, cols]) from :func:`int8_quantize`'s scales (per row, or one) and codes."""
    s = scale.reshape(-1, 1) if scale.numel() == q.shape[0] else scale.reshape(1, 1)
    return q.to(torch.float32) * s


def topk_sparsify(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `k` entries of largest magnitude of every row of `x` [rows, cols] (Aji & Heafield 2017; Lin et al.
    2018): ``(values float32 [rows, k], column indices int64 [rows, k])``; decode with :func:`topk_densify`.

    Example:
        >>> v, i = topk_sparsify(torch.tensor([[0.1, -3.0, 2.0]]), 2)
        >>> v.tolist(), i.tolist()
        ([[-3.0, 2.0]], [[1, 2]])
    """
    idx = x.abs().topk(k, dim=1, sorted=True).indices
    return x.gather(1, idx), idx


def topk_densify(values: torch.Tensor, idx: torch.Tensor, cols: int) -> torch.Tensor:
    """The dense float32 [rows, cols] matrix with `values` at column `idx` of each row, zero elsewhere."""
    return torch.zeros(values.shape[0], cols, dtype=torch.float32).scatter_(1, idx.long(), values)


def _matrix(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """`t` as [rows, cols] in its memory order (channels-last batches as (N, H, W, C)), and whether it is
    channels-last."""
    rows, cols = _rows_cols(tuple(t.shape))
    if _is_channels_last(t):
        return t.permute(0, 2, 3, 1).reshape(rows, cols), True
    return t.contiguous().reshape(rows, cols), False


def _compress_spec(name: str, t: torch.Tensor, codec: Codec, op: str, step: int
                   ) -> tuple[dict[str, Any], list[Any]]:
    """The spec and raw parts of tensor `t` sent under `codec`."""
    if t.dtype != torch.float32:
        raise WireError(f"tensor {name!r}: only float32 tensors can be sent compressed, got {_NAMES[t.dtype]}")
    x, cl = _matrix(t)
    spec: dict[str, Any] = {"name": name, "dtype": "float32", "shape": list(t.shape), "codec": codec.method}
    if cl:
        spec["layout"] = "channels_last"
    if codec.method == "int8":
        u = _uniforms(codec, tuple(x.shape), op, step, name) if codec.stochastic else None
        scale, q = int8_quantize(x, codec.scale == "row", u)
        spec["scale"] = codec.scale
        parts = [scale.numpy().view("uint8"), q.numpy().view("uint8").reshape(-1)]
    else:
        k = codec.k(x.shape[1])
        values, idx = topk_sparsify(x, k)
        spec["k"] = k
        parts = [values.contiguous().numpy().view("uint8").reshape(-1),
                 idx.to(_index_dtype(x.shape[1])).contiguous().numpy().view("uint8").reshape(-1)]
    spec["nbytes"] = sum(p.nbytes for p in parts)
    return spec, parts


def roundtrip(t: torch.Tensor, codec: Codec | None, op: str = "step", step: int = 0, name: str = "t"
              ) -> torch.Tensor:
    """What the receiver decodes when `t` is sent under `codec` (`t` itself when codec is None): the same bytes
    :func:`encode` writes, decoded by :func:`decode` (for in-process studies and the sender's own view).

    Example:
        >>> roundtrip(torch.tensor([[1.0, 0.25]]), Codec("topk", ratio=0.5)).tolist()
        [[1.0, 0.0]]
    """
    if codec is None:
        return t
    msg = Message(op, step=step, tensors={name: t}, codecs={name: codec})
    return decode(encode(msg), max_bytes=2**62).tensors[name]


def _decode_compressed(name: str, spec: dict, shape: list[int], layout: str, view: memoryview, offset: int
                       ) -> tuple[torch.Tensor, int, str]:
    """Check and decode a compressed tensor spec at `offset`; returns (dense tensor, bytes used, description)."""
    codec = spec.get("codec")
    if codec not in CODECS:
        raise WireError(f"tensor {name!r}: codec {codec!r} not allowed; valid: {list(CODECS)}")
    if spec.get("dtype") != "float32":
        raise WireError(f"tensor {name!r}: a compressed tensor decodes to float32, spec says {spec.get('dtype')!r}")
    rows, cols = _rows_cols(shape)
    if codec == "int8":
        scale_kind = spec.get("scale")
        if scale_kind not in ("row", "tensor"):
            raise WireError(f"tensor {name!r}: int8 scale {scale_kind!r}; valid: row, tensor")
        n_scale = rows if scale_kind == "row" else 1
        expected = n_scale * 4 + rows * cols
    else:
        k = spec.get("k")
        if not isinstance(k, int) or isinstance(k, bool) or not (0 <= k <= cols) or (cols and k == 0):
            raise WireError(f"tensor {name!r}: topk k={k!r} must be an integer in [1, {cols}]")
        expected = rows * k * (4 + _index_dtype(cols).itemsize)
    nbytes = spec.get("nbytes")
    if nbytes != expected:
        raise WireError(f"tensor {name!r}: {nbytes!r} bytes declared, {codec} of float32{shape} needs {expected}")
    if offset + expected > len(view):
        raise WireError(f"tensor {name!r}: truncated message ({len(view) - offset} of {expected} bytes)")
    buf = bytearray(view[offset : offset + expected])
    raw = torch.frombuffer(buf, dtype=torch.uint8) if expected else torch.empty(0, dtype=torch.uint8)
    if codec == "int8":
        scale = raw[: n_scale * 4].view(torch.float32)
        q = raw[n_scale * 4 :].view(torch.int8).reshape(rows, cols)
        if scale.numel() and not (bool(torch.isfinite(scale).all()) and float(scale.min()) >= 0):
            raise WireError(f"tensor {name!r}: int8 scales must be finite and non-negative")
        if q.numel() and int(q.min()) < -127:
            raise WireError(f"tensor {name!r}: int8 code -128 is outside the symmetric range [-127, 127]")
        dense = int8_dequantize(scale, q)
        what = f"int8/{scale_kind}"
    else:
        values = raw[: rows * k * 4].view(torch.float32).reshape(rows, k)
        idx = raw[rows * k * 4 :].view(_index_dtype(cols)).reshape(rows, k).long()
        if idx.numel():
            if int(idx.min()) < 0 or int(idx.max()) >= cols:
                raise WireError(f"tensor {name!r}: topk indices outside [0, {cols})")
            srt = idx.sort(dim=1).values
            if bool((srt[:, 1:] == srt[:, :-1]).any()):
                raise WireError(f"tensor {name!r}: topk indices repeated within a row")
        dense = topk_densify(values, idx, cols)
        what = f"topk(k={k} of {cols})"
    if layout == "channels_last":
        n, ch, h, w = shape
        t = dense.reshape(n, h, w, ch).permute(0, 3, 1, 2)
    else:
        t = dense.reshape(shape)
    return t, expected, f"{what} {expected} B"


def wire_note(request: Message, reply: Message) -> str:
    """What of a request arrived compressed and what of its reply leaves compressed, for the audit record's
    reason (empty when nothing is compressed), e.g. ``"; received h as int8/row 4112 B; g sent as topk(k=103 of
    1024) 2472 B"``."""
    parts = [f"received {k} as {v}" for k, v in request.received.items()]
    parts += [f"{k} sent as {c.describe(list(reply.tensors[k].shape))} "
              f"{compressed_nbytes(list(reply.tensors[k].shape), c)} B"
              for k, c in reply.codecs.items() if k in reply.tensors]
    return "".join(f"; {p}" for p in parts)


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
    dense_total = 0  # bytes of the decoded tensors: a compressed one may not decode beyond the message limit
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
        if "codec" in spec:
            dense_total += math.prod(shape) * 4
            if dense_total > max_bytes:
                raise WireError(f"tensor {name!r}: decodes to {math.prod(shape) * 4} bytes, beyond the limit of "
                                f"{max_bytes} bytes of this message")
            t, used, what = _decode_compressed(name, spec, shape, layout, view, offset)
            offset += used
            if not allow_nonfinite and t.numel() and not all_finite(t):
                raise WireError(f"tensor {name!r} contains NaN or Inf")
            msg.tensors[name] = t
            msg.received[name] = what
            continue
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

    The bound runs out only while the predecessor is *absent*: while it is in progress here (it entered
    :meth:`turn` and has not finished: waiting for its own turn, for the party's lock, or being processed), its
    successor keeps waiting, however slow the host is. Otherwise, with two requests queued behind a request that
    takes longer than `wait_s` (a loaded host; a pipelined link k + 1 = 3 steps deep), both would give up waiting
    and race for the party's lock, and the later one, winning, would be refused as out of order (a legitimate
    caller then has to undo and resend its steps). This keeps the protection: a peer holds at most
    `max_waiting` waiting threads, each for at most `wait_s` beyond the processing of requests this party is
    actually running (and a predecessor that is itself waiting for an absent one gives up after `wait_s`).

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
        # (peer, session) -> the numbers in progress here (entered turn(), not finished): waited for without bound
        self._in_progress: dict[tuple[str, str], set[int]] = {}
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
                while not self._through(key, seq):
                    if seq - 1 in self._in_progress.get(key, ()):
                        # the predecessor is being handled here: wait for it, and give it wait_s again should it
                        # end without being recorded (it cannot: finished() records every request that arrived)
                        deadline = time.monotonic() + self.wait_s
                        self._cv.wait(self.wait_s)
                        continue
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cv.wait(left)
            finally:
                self._waiting -= 1

    @contextmanager
    def turn(self, peer: str, session: str, seq: int, accepted: Callable[[], int]) -> Iterator[None]:
        """Wait for the turn of request `seq` (:meth:`wait`); on leaving, however it ends, record it with
        `accepted()`, the last number the sequence guard has accepted by then. From its arrival to its end, the
        request is in progress (its successor waits for it without the `wait_s` bound)."""
        key = (peer, session)
        with self._cv:
            self._in_progress.setdefault(key, set()).add(seq)
            self._cv.notify_all()
        try:
            self.wait(peer, session, seq)
            yield
        finally:
            self.finished(peer, session, seq, accepted())

    def finished(self, peer: str, session: str, seq: int, accepted: int) -> None:
        """Request `seq` of (peer, session) is done; `accepted`: the guard's last accepted number now (`seq` if
        this one was accepted). Wakes the request waiting for it."""
        key = (peer, session)
        with self._cv:
            going = self._in_progress.get(key)
            if going is not None:
                going.discard(seq)
                if not going:
                    del self._in_progress[key]
            refused = self._state.get(key, (0, -1))[1]
            self._state[key] = (accepted, seq if accepted < seq else refused)
            self._state.move_to_end(key)
            while len(self._state) > self.max_keys:
                self._state.popitem(last=False)
            self._cv.notify_all()
