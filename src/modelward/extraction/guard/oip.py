"""The Open Inference Protocol (KServe v2) codec: request bodies in, response bodies out; no HTTP, no state.

JSON requests and the binary tensor extension (a JSON header of ``Inference-Header-Content-Length`` bytes followed
by little-endian blobs) are parsed into an :class:`InferRequest`. The input is FP32 (images, tabular rows), or for
text models INT64 token ids (``[batch, tokens]``, at most the model's length, right-padded here with its padding id)
or BYTES strings (``[batch]``, UTF-8, tokenized by the model's tokenizer); :func:`encode_response` writes the answer in
the form the request asked for, echoing its ``id`` and ``parameters``. Every malformed request raises
:class:`~modelward.extraction.guard.errors.GuardError` with a machine-readable code (the HTTP layer maps it to 4xx).
Modelled on KServe's ``protocol/infer_type.py`` (``InferRequest.from_bytes``, ``to_rest``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from modelward.extraction.guard.errors import GuardError

try:  # 10× faster than the standard library on tensors of floats (the request's main cost); same semantics, except
    # that NaN/Infinity literals (not JSON) are invalid JSON rather than non-finite data: both are 400s
    import orjson

    _loads, _dumps = orjson.loads, orjson.dumps
except ImportError:  # pragma: no cover - orjson is a dependency; keep working without it
    _loads = json.loads

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

INPUT_NAME = "input"
OUTPUT_NAME = "probabilities"
DATATYPES = ("FP32", "INT64", "BYTES")  # what a model's input may be (GUARD.toml [model] input_datatype)
MAX_TEXT_BYTES = 65536  # one BYTES element (a text) at most
MAX_ECHO_DEPTH = 32  # `parameters` are echoed in the answer; orjson refuses to write more than 254 levels


def _depth(obj: Any) -> int:
    """Nesting depth of a JSON value (0 for a scalar), without recursion."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        cur, d = stack.pop()
        if isinstance(cur, dict):
            cur = list(cur.values())
        if isinstance(cur, list):
            deepest = max(deepest, d)
            stack.extend((v, d + 1) for v in cur if isinstance(v, (dict, list)))
    return deepest


@dataclass
class InferRequest:
    """A parsed Open Inference Protocol request: the input batch and what the answer must echo."""

    x: torch.Tensor
    id: str | None = None
    parameters: dict[str, Any] | None = None
    binary_output: bool = False

    @classmethod
    def parse(cls, body: bytes, header_length: str | None, input_shape: tuple[int, ...],
              max_batch: int, text: TextInput | None = None) -> InferRequest:
        """Parse and validate one inference request (JSON, or the binary tensor extension's header + blobs).

        Args:
            body: the request body.
            header_length: the ``Inference-Header-Content-Length`` header (binary extension), or None.
            input_shape: the model's input shape without the batch dimension (text: ``(tokens,)``).
            max_batch: most rows per request.
            text: for a text model, how its input arrives (INT64 ids or BYTES strings); None: FP32.

        Returns:
            The request, its input as a float32 tensor of shape ``[batch, *input_shape]`` (text: int64 token ids
            ``[batch, tokens]``, right-padded).

        Raises:
            GuardError: invalid or too deeply nested JSON, a value that is not a JSON number (strings, booleans at
                any depth, null), wrong shapes, NaN/inf (code ``bad_*``), or too many rows (``batch_too_large``).

        Example:
            >>> InferRequest.parse(b'{"inputs":[{"name":"input","shape":[1,2],"datatype":"FP32","data":[1,2]}]}',
            ...                    None, (2,), 8).x.tolist()
            [[1.0, 2.0]]
        """
        binary = b""
        if header_length is not None:
            if not header_length.isdigit() or int(header_length) > len(body):
                raise GuardError("bad_request", f"Inference-Header-Content-Length {header_length!r} must be "
                                 f"an integer <= the body size ({len(body)} bytes)")
            n = int(header_length)
            body, binary = body[:n], body[n:]
        try:
            payload = _loads(body)
        except RecursionError:
            raise GuardError("bad_request", "request JSON is nested too deeply") from None
        except (ValueError, UnicodeDecodeError) as e:
            if "depth" in str(e):  # orjson's nesting limit
                raise GuardError("bad_request", "request JSON is nested too deeply") from None
            raise GuardError("bad_request", "request body is not valid JSON") from None
        if not isinstance(payload, dict) or not isinstance(payload.get("inputs"), list) or len(payload["inputs"]) != 1:
            raise GuardError("bad_request", "body must be {\"inputs\": [one tensor]} (Open Inference Protocol)")
        rid = payload.get("id")
        if rid is not None and not isinstance(rid, str):
            raise GuardError("bad_request", f"id must be a string, got {type(rid).__name__}")
        params = payload.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise GuardError("bad_request", "parameters must be an object")
        binary_out = bool(params and params.get("binary_data_output") is True)
        outputs = payload.get("outputs")
        if outputs is not None:
            if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
                raise GuardError("bad_request", "outputs must be a list of objects {\"name\": ...}")
            for o in outputs:
                if o.get("name") != OUTPUT_NAME:
                    raise GuardError("bad_request", f"unknown output {o.get('name')!r}; this model has one "
                                     f"output, {OUTPUT_NAME!r}")
                op = o.get("parameters")
                if op is not None and not isinstance(op, dict):
                    raise GuardError("bad_request", "outputs[].parameters must be an object")
                if op and "binary_data" in op:
                    binary_out = op["binary_data"] is True
        t = payload["inputs"][0]
        if not isinstance(t, dict):
            raise GuardError("bad_request", "inputs[0] must be an object with name, shape, datatype, data")
        if t.get("name") != INPUT_NAME:
            raise GuardError("bad_request", f"inputs[0].name must be {INPUT_NAME!r}, got {t.get('name')!r}")
        datatype = "FP32" if text is None else text.datatype
        if t.get("datatype") != datatype:
            raise GuardError("bad_datatype", f"inputs[0].datatype must be {datatype!r}, got {t.get('datatype')!r}")
        shape = t.get("shape")
        if text is not None:
            text.check_shape(shape, input_shape)
        elif (not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
                or len(shape) != 1 + len(input_shape) or tuple(shape[1:]) != tuple(input_shape)
                or shape[0] < 1):
            raise GuardError("bad_shape", f"inputs[0].shape must be [batch >= 1, "
                             f"{', '.join(map(str, input_shape))}], got {shape!r}")
        try:  # from here on the request's row count is known: refusals log it
            if shape[0] > max_batch:
                raise GuardError("batch_too_large", f"batch of {shape[0]} rows exceeds max_batch={max_batch}")
            need = math.prod(shape)
            tparams = t.get("parameters")
            if tparams is not None and not isinstance(tparams, dict):
                raise GuardError("bad_request", "inputs[0].parameters must be an object")
            if text is not None:  # token ids or strings: their own codec (TextInput)
                x = text.read(t, tparams, body, binary, header_length, shape, input_shape)
                for field, value in (("parameters", params), ("inputs[0].parameters", tparams),
                                     ("outputs", outputs)):
                    if _depth(value) > MAX_ECHO_DEPTH:
                        raise GuardError("bad_request", f"{field} is nested deeper than {MAX_ECHO_DEPTH} levels")
                return cls(x, rid, params, binary_out)
            if tparams and "binary_data_size" in tparams:
                size = tparams["binary_data_size"]
                if header_length is None:
                    raise GuardError("bad_request", "inputs[0].parameters.binary_data_size needs the "
                                     "Inference-Header-Content-Length header (binary tensor extension)")
                if not isinstance(size, int) or isinstance(size, bool) or size != len(binary) or size != 4 * need:
                    raise GuardError("bad_shape", f"binary_data_size {size!r}: shape {shape} in FP32 needs "
                                     f"{4 * need} bytes and {len(binary)} bytes follow the JSON header")
                if "data" in t:
                    raise GuardError("bad_request", "inputs[0] has both data and binary_data_size")
                data = np.frombuffer(binary, dtype="<f4").astype(np.float32)
            else:
                if binary:
                    raise GuardError("bad_request", "binary data follows the JSON header but no input declares "
                                     "parameters.binary_data_size")
                data = _json_data(t.get("data"), body, shape, need)
            if not np.isfinite(data).all():
                raise GuardError("bad_data", "inputs[0].data contains NaN or infinite values")
            for field, value in (("parameters", params), ("inputs[0].parameters", tparams), ("outputs", outputs)):
                if _depth(value) > MAX_ECHO_DEPTH:  # echoed or kept: refused before anything is charged
                    raise GuardError("bad_request", f"{field} is nested deeper than {MAX_ECHO_DEPTH} levels")
        except GuardError as e:
            e.rows = shape[0]
            raise
        return cls(torch.from_numpy(data.reshape(shape)), rid, params, binary_out)


@dataclass(frozen=True)
class TextInput:
    """How a text model's input arrives: INT64 token ids ``[batch, n]`` (n at most the model's length) or BYTES
    strings ``[batch]`` (UTF-8; JSON strings, or the binary extension's 4-byte little-endian length + bytes per
    element), tokenized by `tokenize`. Either way the model gets int64 ids ``[batch, length]``, right-padded with
    `pad_id`; ids outside ``[0, vocab_size)`` are refused (an embedding would fail on them).

    Example:
        >>> t = TextInput("INT64", pad_id=0, vocab_size=100)
        >>> InferRequest.parse(b'{"inputs":[{"name":"input","shape":[1,3],"datatype":"INT64","data":[1,7,2]}]}',
        ...                    None, (5,), 8, t).x.tolist()
        [[1, 7, 2, 0, 0]]
    """

    datatype: str
    pad_id: int = 0
    vocab_size: int | None = None
    tokenize: Callable[[list[str]], np.ndarray] | None = None  # BYTES: strings -> ids (rows × ≤ length)

    def check_shape(self, shape: Any, input_shape: tuple[int, ...]) -> None:
        ok = isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
        if self.datatype == "INT64":
            if not (ok and len(shape) == 2 and shape[0] >= 1 and 1 <= shape[1] <= input_shape[0]):
                raise GuardError("bad_shape", f"inputs[0].shape must be [batch >= 1, tokens <= {input_shape[0]}], "
                                 f"got {shape!r}")
        elif not (ok and len(shape) == 1 and shape[0] >= 1):
            raise GuardError("bad_shape", f"inputs[0].shape must be [batch >= 1] (one string per row), got {shape!r}")

    def read(self, t: dict[str, Any], tparams: dict[str, Any] | None, body: bytes, binary: bytes,
             header_length: str | None, shape: list[int], input_shape: tuple[int, ...]) -> torch.Tensor:
        """The request's token ids, int64 ``[batch, input_shape[0]]``."""
        binary_size = tparams.get("binary_data_size") if tparams else None
        if binary_size is not None:
            if header_length is None:
                raise GuardError("bad_request", "inputs[0].parameters.binary_data_size needs the "
                                 "Inference-Header-Content-Length header (binary tensor extension)")
            if not isinstance(binary_size, int) or isinstance(binary_size, bool) or binary_size != len(binary):
                raise GuardError("bad_shape", f"binary_data_size {binary_size!r}: {len(binary)} bytes follow the JSON "
                                 "header")
            if "data" in t:
                raise GuardError("bad_request", "inputs[0] has both data and binary_data_size")
        elif binary:
            raise GuardError("bad_request", "binary data follows the JSON header but no input declares "
                             "parameters.binary_data_size")
        if self.datatype == "INT64":
            need = math.prod(shape)
            if binary_size is not None:
                if len(binary) != 8 * need:
                    raise GuardError("bad_shape", f"shape {shape} in INT64 needs {8 * need} bytes, got {len(binary)}")
                ids = np.frombuffer(binary, dtype="<i8").astype(np.int64)
            else:
                ids = _json_ints(t.get("data"), body, shape, need)
            ids = ids.reshape(shape)
        else:
            texts = _bytes_elements(binary, shape[0]) if binary_size is not None else _json_strings(t.get("data"),
                                                                                                    shape[0])
            assert self.tokenize is not None, "a BYTES model needs a tokenizer"
            ids = self.tokenize(texts)[:, : input_shape[0]]
        if ids.size and (ids.min() < 0 or (self.vocab_size is not None and ids.max() >= self.vocab_size)):
            raise GuardError("bad_data", f"token ids must lie in [0, {self.vocab_size}) (the model's vocabulary)")
        out = np.full((len(ids), input_shape[0]), self.pad_id, dtype=np.int64)
        out[:, : ids.shape[1]] = ids
        return torch.from_numpy(out)


def _json_ints(raw: Any, body: bytes, shape: list[int], need: int) -> np.ndarray:
    """INT64 ``data`` (flat, or nested to ``shape``) as a flat int64 array; floats, strings and booleans refused."""
    if not isinstance(raw, list):
        raise GuardError("bad_data", "inputs[0].data must be a list of integers (token ids)")
    try:
        arr = np.asarray(raw)
    except (ValueError, TypeError, RecursionError, OverflowError):
        raise GuardError("bad_data", "inputs[0].data must be a flat list of integers or nested to the shape") from None
    if arr.dtype.kind not in "iu" or (_may_hold_bool(body) and _has_bool(raw)):
        raise GuardError("bad_data", "inputs[0].data must hold integers only (INT64 token ids)")
    if arr.ndim != 1 and list(arr.shape) != shape:
        raise GuardError("bad_shape", f"inputs[0].data is nested as {list(arr.shape)}; use a flat list or {shape}")
    if arr.size != need:
        raise GuardError("bad_shape", f"inputs[0].data has {arr.size} values; shape {shape} needs {need}")
    return arr.astype(np.int64).reshape(-1)


def _json_strings(raw: Any, batch: int) -> list[str]:
    if not isinstance(raw, list) or len(raw) != batch or not all(isinstance(v, str) for v in raw):
        raise GuardError("bad_data", f"inputs[0].data must be a list of {batch} strings (BYTES)")
    if any(len(v.encode()) > MAX_TEXT_BYTES for v in raw):
        raise GuardError("bad_data", f"a text is longer than {MAX_TEXT_BYTES} bytes")
    return raw


def _bytes_elements(blob: bytes, batch: int) -> list[str]:
    """The binary extension's BYTES tensor: per element a 4-byte little-endian length, then that many bytes."""
    out, pos = [], 0
    for _ in range(batch):
        if pos + 4 > len(blob):
            raise GuardError("bad_data", "BYTES binary data ends inside an element's length prefix")
        n = int.from_bytes(blob[pos : pos + 4], "little")
        if n > MAX_TEXT_BYTES or pos + 4 + n > len(blob):
            raise GuardError("bad_data", f"a BYTES element of {n} bytes is too long or runs past the data")
        try:
            out.append(blob[pos + 4 : pos + 4 + n].decode("utf-8"))
        except UnicodeDecodeError:
            raise GuardError("bad_data", "a BYTES element is not UTF-8 text") from None
        pos += 4 + n
    if pos != len(blob):
        raise GuardError("bad_data", f"BYTES binary data has {len(blob) - pos} bytes after its {batch} elements")
    return out


def _json_data(raw: Any, body: bytes, shape: list[int], need: int) -> np.ndarray:
    """The tensor's values from JSON ``data`` (flat row-major, or nested to ``shape``) as a flat float32 array."""
    if not isinstance(raw, list):
        raise GuardError("bad_data", "inputs[0].data must be a list of numbers (flat, row-major, or nested to the "
                         "tensor's shape)")
    try:
        arr = np.asarray(raw)
    except (ValueError, TypeError, RecursionError, OverflowError):
        raise GuardError("bad_data", "inputs[0].data must be a flat list of numbers or a list nested exactly to "
                         "the tensor's shape") from None
    if arr.dtype.kind not in "fiu":
        what = {"U": "strings", "S": "strings", "b": "booleans"}.get(arr.dtype.kind, "non-numbers")
        raise GuardError("bad_data", f"inputs[0].data must hold JSON numbers only, found {what}")
    # bools mixed with numbers are silently converted by numpy; JSON true/false only exist if the text has them
    if _may_hold_bool(body) and _has_bool(raw):
        raise GuardError("bad_data", "inputs[0].data must hold JSON numbers only, found booleans")
    if arr.ndim != 1 and list(arr.shape) != shape:
        raise GuardError("bad_shape", f"inputs[0].data is nested as {list(arr.shape)}; use a flat list or nest it "
                         f"as {shape}")
    if arr.size != need:
        raise GuardError("bad_shape", f"inputs[0].data has {arr.size} values; shape {shape} needs {need}")
    with np.errstate(over="ignore"):
        return arr.astype(np.float32).reshape(-1)


def _may_hold_bool(body: bytes) -> bool:
    """Whether the JSON text holds a ``true`` or ``false`` literal anywhere. The one-byte searches (memchr) come first:
    a request without ``parameters`` has no "r" or "l" at all, and the four- and five-byte searches cost ~30 µs on a
    16-row request (measured; the request's whole parse is ~80 µs)."""
    return (b"r" in body and b"true" in body) or (b"l" in body and b"false" in body)


def _has_bool(raw: list) -> bool:
    """True if a (possibly nested) JSON list holds a boolean anywhere (bool is an int subclass in Python)."""
    stack = [raw]
    while stack:
        cur = stack.pop()
        for v in cur:
            if v is True or v is False:
                return True
            if isinstance(v, list):
                stack.append(v)
    return False


def encode_response(req: InferRequest, y_hat: torch.Tensor, model_name: str) -> tuple[bytes, int | None]:
    """The response body for ``req``: JSON, or JSON header + little-endian FP32 blob when binary output was asked.

    Args:
        req: the parsed request (its ``id`` and ``parameters`` are echoed).
        y_hat: the B × K answer (float32, CPU).
        model_name: the served model's name.

    Returns:
        ``(body, header_length)``; ``header_length`` is the ``Inference-Header-Content-Length`` value for the
        binary extension, else None.
    """
    out: dict[str, Any] = {"name": OUTPUT_NAME, "datatype": "FP32", "shape": list(y_hat.shape)}
    blob = b""
    if req.binary_output:
        blob = y_hat.numpy().astype("<f4").tobytes()
        out["parameters"] = {"binary_data_size": len(blob)}
    else:
        out["data"] = y_hat.flatten().tolist()
    resp: dict[str, Any] = {"model_name": model_name, "model_version": "1"}
    if req.id is not None:
        resp["id"] = req.id
    if req.parameters:
        resp["parameters"] = req.parameters
    resp["outputs"] = [out]
    head = _dumps(resp)
    return (head + blob, len(head)) if req.binary_output else (head, None)


def model_metadata(name: str, input_shape: tuple[int, ...], num_classes: int, defense: str,
                   max_batch: int, datatype: str = "FP32") -> dict[str, Any]:
    """The ``GET /v2/models/{name}`` body: one input (FP32 ``[-1, *input_shape]``; text: INT64 ``[-1, -1]`` token
    ids or BYTES ``[-1]`` strings, with ``max_tokens`` in the parameters), one FP32 output ``[-1, K]``."""
    shape = {"FP32": [-1, *input_shape], "INT64": [-1, -1], "BYTES": [-1]}[datatype]
    params: dict[str, Any] = {"defense": defense, "max_batch_size": max_batch}
    if datatype != "FP32":
        params["max_tokens"] = input_shape[0]
    return {"name": name, "versions": ["1"], "platform": "modelward-guard",
            "inputs": [{"name": INPUT_NAME, "datatype": datatype, "shape": shape}],
            "outputs": [{"name": OUTPUT_NAME, "datatype": "FP32", "shape": [-1, num_classes]}],
            "parameters": params}
