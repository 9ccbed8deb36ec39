"""Checkpoints as safetensors. Nothing here unpickles: untrusted files can never run code."""

from __future__ import annotations

import json
import os
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
    save_file(flat, str(tmp), metadata=metadata)
    os.replace(tmp, path)


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

    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {})


def save_state_dict(path: str | Path, state: dict[str, torch.Tensor], extra: dict | None = None) -> None:
    """Save a model state dict; `extra` (JSON-serialisable) travels in the safetensors metadata."""
    meta = {"modelward": json.dumps(extra or {})}
    save_tensors(path, state, meta)


def load_state_dict(path: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    tensors = load_tensors(path)
    meta = load_metadata(path)
    return tensors, json.loads(meta.get("modelward", "{}"))


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
