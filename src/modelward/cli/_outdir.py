"""Checks shared by the commands that write into an output folder (``--out DIR``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from modelward.errors import ConfigError


def check_out_dir(out: Path, option: str = "--out") -> None:
    """A folder we may create or reuse; a path that exists as a file is a clear error, not an OSError."""
    for p in (out, *out.parents):
        if p.exists() and not p.is_dir():
            raise ConfigError(f"{option} {out}: {p} is a file, not a folder; pass a folder path")


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out |= _flat(v, f"{prefix}{k}.")
        return out
    return {prefix[:-1]: d}


def config_diff(old: dict[str, Any], new: dict[str, Any], limit: int = 5) -> str:
    """The first fields that differ, as 'key: old -> new'."""
    a, b = _flat(old), _flat(new)
    keys = sorted(k for k in a.keys() | b.keys() if a.get(k, "<unset>") != b.get(k, "<unset>"))
    shown = [f"{k}: {a.get(k, '<unset>')!r} -> {b.get(k, '<unset>')!r}" for k in keys[:limit]]
    return "; ".join(shown) + (f"; and {len(keys) - limit} more" if len(keys) > limit else "")


def refuse_other_config(out: Path, config_json: str, new: dict[str, Any], results: tuple[str, ...]) -> None:
    """Refuse to write a run of a different config over a folder that already holds results of another one."""
    prev = out / config_json
    if not prev.is_file() or not any((out / r).exists() for r in results):
        return
    try:
        old = json.loads(prev.read_text())
    except (OSError, ValueError):
        return
    if old != new:
        raise ConfigError(f"--out {out}: this folder holds a run of a different config ({config_diff(old, new)}). "
                          "Use a new --out folder, or delete the old one to start over.")
