"""Checkpoints as safetensors. Nothing here unpickles: untrusted files can never run code."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from modelward.errors import DataError


def save_tensors(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """Atomically write `tensors` to a safetensors file (write to a temp file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    flat = {k: v.detach().contiguous().cpu().clone() for k, v in tensors.items()}
    try:
        save_file(flat, str(tmp), metadata=metadata)
        os.replace(tmp, path)
    except SafetensorError as e:  # the library's I/O errors: a full disk becomes the OSError it is, naming the file
        tmp.unlink(missing_ok=True)
        for code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            if f"code: {code}," in str(e):
                raise OSError(code, os.strerror(code), str(path)) from None
        raise DataError(f"{path}: cannot write the checkpoint ({e})") from None
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


_SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                       torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
                       torch.uint8: "U8", torch.bool: "BOOL"}


def write_safetensors(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
                      ) -> None:
    """Write `tensors` (contiguous CPU tensors) to `path` in the safetensors format, the tensor bytes straight
    from their memory with the GIL released.

    For background writers: ``safetensors.torch.save_file`` holds the GIL for the whole serialisation (≈ 1 ms at
    a time for a 2 MB checkpoint), which stalls every Python thread of the process, a party's step included.
    The file is the format the safetensors library reads (8-byte header length, JSON header with ``dtype``,
    ``shape`` and ``data_offsets`` per tensor and ``__metadata__``, padded to 8 bytes, then the data); tests read
    it back with :func:`load_tensors` and ``safe_open``.

    Args:
        path: the file to write (not atomic by itself: write to a temporary name and rename).
        tensors: name -> contiguous CPU tensor of a dtype safetensors knows.
        metadata: string -> string, stored under ``__metadata__``.

    Returns:
        None.

    Example:
        >>> write_safetensors("/tmp/x.safetensors", {"w": torch.ones(2)}, {"step": "3"})  # doctest: +SKIP
    """
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    blobs, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name]
        if t.dtype not in _SAFETENSORS_DTYPES or t.device.type != "cpu" or not t.is_contiguous():
            raise ValueError(f"tensor {name!r}: a contiguous CPU tensor of {sorted(map(str, _SAFETENSORS_DTYPES))} "
                             f"is needed, got {t.dtype} on {t.device}")
        raw = t.detach().reshape(-1).view(torch.uint8).numpy()  # a view of the tensor's memory
        header[name] = {"dtype": _SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + raw.nbytes]}
        blobs.append(raw)
        offset += raw.nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:  # large writes go straight to write(2), which runs without the GIL
        f.write(len(head).to_bytes(8, "little"))
        f.write(head)
        for raw in blobs:
            f.write(memoryview(raw))


def load_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: checkpoint not found")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise DataError(f"{path}: not a valid safetensors file ({e})") from None


def load_metadata(path: str | Path) -> dict[str, str]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError) as e:
        raise DataError(f"{path}: not a valid safetensors file ({e})") from None


def save_state_dict(path: str | Path, state: dict[str, torch.Tensor], extra: dict | None = None) -> None:
    """Save a model state dict; `extra` (JSON-serialisable) travels in the safetensors metadata."""
    meta = {"modelward": json.dumps(extra or {})}
    save_tensors(path, state, meta)


def load_state_dict(path: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """The tensors of a :func:`save_state_dict` file and its ``extra`` metadata (a dict).

    Raises:
        DataError: the file is missing, not safetensors, or its ``modelward`` metadata is not a JSON object.
    """
    tensors = load_tensors(path)
    meta = load_metadata(path)
    try:
        extra = json.loads(meta.get("modelward", "{}"))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: its 'modelward' metadata is not valid JSON ({e}); the file is damaged or was not "
                        "written by modelward: re-save it with modelward.core.io.save_state_dict") from None
    if not isinstance(extra, dict):
        raise DataError(f"{path}: its 'modelward' metadata is {type(extra).__name__}, not a JSON object; re-save it "
                        "with modelward.core.io.save_state_dict")
    return tensors, extra


def _names(items: list[str], limit: int = 6) -> str:
    return ", ".join(items[:limit]) + (f" (+{len(items) - limit} more)" if len(items) > limit else "")


def check_state(model: torch.nn.Module, state: Mapping[str, torch.Tensor], source: str | Path,
                strict: bool = True) -> None:
    """Refuse weights that would load wrongly, with everything wrong named in one message: tensors the model lacks
    or the file lacks (``strict``), shapes that differ (another architecture), a dtype other than the model's
    (``load_state_dict`` would cast silently: a BOOL tensor becomes 0/1 floats, F16 loses nothing visible but is
    not what was trained) and NaN/Inf values (every answer would be NaN).

    Args:
        model: the model the weights are for (its ``state_dict`` gives the expected names, shapes and dtypes).
        state: name -> tensor, as read from the file.
        source: the file (or config field), named at the start of the message.
        strict: every name must match both ways (else only the names present in both are checked).

    Raises:
        DataError: naming the file, the model's class and, for each problem, the tensors with what the file has
        and what the model expects (lists cut after six names, with the count of the rest).

    Example:
        >>> net = torch.nn.Linear(2, 1)
        >>> check_state(net, {"weight": torch.ones(1, 2, dtype=torch.bool), "bias": torch.zeros(1)}, "m.safetensors")
        Traceback (most recent call last):
        modelward.errors.DataError: m.safetensors: tensor 'weight' is torch.bool, the model expects torch.float32 ...
    """
    expected = model.state_dict()
    arch = type(model).__name__
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shapes = [f"{k} is {list(t.shape)} in the file, {list(expected[k].shape)} in the model" for k, t in state.items()
              if k in expected and tuple(t.shape) != tuple(expected[k].shape)]
    problems = []
    if shapes:
        problems.append(f"{len(shapes)} tensor(s) of another shape: {'; '.join(shapes[:4])}"
                        f"{f' (+{len(shapes) - 4} more)' if len(shapes) > 4 else ''}")
    if strict and missing:
        problems.append(f"{len(missing)} tensor(s) of the model missing from the file: {_names(missing)}")
    if strict and unexpected:
        problems.append(f"{len(unexpected)} tensor(s) in the file the model does not have: {_names(unexpected)}")
    if problems:
        raise DataError(f"{source}: the weights do not match the model ({arch}, {len(expected)} tensors; the file has "
                        f"{len(state)}): {' | '.join(problems)}. The file was written for another architecture or "
                        "size: build the model it was trained with (the [model] settings), or use its checkpoint")
    for name, t in state.items():
        want = expected.get(name)
        if want is not None and t.dtype != want.dtype:
            raise DataError(f"{source}: tensor {name!r} is {t.dtype}, the model expects {want.dtype} (dtypes are "
                            f"not converted on load; convert the checkpoint to {want.dtype} if that is what you "
                            "mean)")
    bad = [f"{name!r} ({int(torch.isnan(t).sum())} NaN, {int(torch.isinf(t).sum())} inf of {t.numel()} values)"
           for name, t in state.items() if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all())]
    if bad:
        raise DataError(f"{source}: non-finite weights in {len(bad)} tensor(s): {_names(bad, 5)}; the checkpoint is "
                        "damaged or its training diverged (a model with NaN/inf weights answers NaN): retrain it or "
                        "use an earlier checkpoint")


def load_into(model: torch.nn.Module, state: Mapping[str, torch.Tensor], source: str | Path, *,
              strict: bool = True) -> torch.nn.Module:
    """The one strict way weights enter a model (issue 37 item 4): :func:`check_state` (names, shapes, dtypes,
    finite values, all named in one message), then ``load_state_dict``. Every path that loads weights — the guard,
    assess, robust, privacy, split parties, training resume — calls this (or :func:`load_weights` for a file).

    Args:
        model: the model, already built with the architecture the weights are for.
        state: name -> tensor (a file's tensors, possibly with a prefix already stripped).
        source: the file or field, named in errors.
        strict: every name must match (``torch.nn.Module.load_state_dict``'s `strict`).

    Returns:
        `model` (its mode unchanged).

    Raises:
        DataError: the weights do not fit (see :func:`check_state`).

    Example:
        >>> net = load_into(torch.nn.Linear(2, 1), {"weight": torch.ones(1, 2), "bias": torch.zeros(1)}, "x")
    """
    check_state(model, state, source, strict)
    try:
        model.load_state_dict(dict(state), strict=strict)
    except RuntimeError as e:  # what check_state cannot see (a module's own load hook): the whole message
        raise DataError(f"{source}: the weights do not match the model ({type(model).__name__}): "
                        f"{' '.join(str(e).split())}") from None
    return model


def load_weights(model: torch.nn.Module, path: str | Path, strict: bool = True) -> dict:
    """Load a :func:`save_state_dict` checkpoint into `model` through :func:`load_into`.

    Args:
        model: the model, already built with the right architecture.
        path: the safetensors checkpoint.
        strict: every key must match (``torch.nn.Module.load_state_dict``'s `strict`).

    Returns:
        The checkpoint's ``extra`` metadata.

    Raises:
        DataError: missing/invalid file, bad metadata, names/shapes that do not fit the model, dtype mismatch,
        non-finite values.

    Example:
        >>> meta = load_weights(net, "runs/x/model.safetensors")  # doctest: +SKIP
    """
    tensors, meta = load_state_dict(path)
    load_into(model, tensors, path, strict=strict)
    return meta


def optimizer_to_tensors(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Flatten an optimizer state dict to tensors + a JSON skeleton (for safetensors checkpoints)."""
    sd = opt.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    skeleton: dict = {"param_groups": sd["param_groups"], "state": {}}
    for pid, st in sd["state"].items():
        entry = {}
        for k, v in st.items():
            if torch.is_tensor(v):
                name = f"opt.{pid}.{k}"
                tensors[name] = v
                entry[k] = {"tensor": name}
            else:
                entry[k] = {"value": v}
        skeleton["state"][str(pid)] = entry
    return tensors, skeleton


def optimizer_from_tensors(opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], skeleton: dict) -> None:
    state = {}
    for pid, entry in skeleton["state"].items():
        st = {}
        for k, v in entry.items():
            st[k] = tensors[v["tensor"]] if "tensor" in v else v["value"]
        state[int(pid)] = st
    opt.load_state_dict({"state": state, "param_groups": skeleton["param_groups"]})
