"""Per-point outcomes in a report: which points a proportion was counted on, and each point's result, compactly.

A robust accuracy of k of n points is recorded with (in its metric's ``context``)

- ``points``: what identifies the evaluated points: ``{"indices": "x_test[0:200]", "n": 200, "sha256": "…"}``, the
  SHA-256 of the inputs' dtype, shape and bytes and of the labels (:func:`points_id`): equal ids mean the very same
  inputs with the same labels, not merely the same count or the same row numbers of a file that may have changed;
- ``outcomes``: the per-point results as a bitset in hexadecimal (:func:`pack_outcomes`; bit i, most significant
  first, is True when point i is still classified correctly after the attack): 200 points take 50 characters.

``assess diff`` pairs two such metrics only when their ids are equal and both bitsets are consistent with their own
``k`` and ``n`` (:func:`paired_cells`); it then uses Newcombe's paired interval
(:func:`modelward.core.stats.newcombe_paired`), and the unpaired one otherwise, saying why.

Example:
    >>> import torch
    >>> x, y = torch.zeros(3, 2), torch.tensor([0, 1, 1])
    >>> a = {"k": 2, "n": 3, "context": {"outcomes": pack_outcomes([True, False, True]), "points": points_id(x, y)}}
    >>> b = {"k": 1, "n": 3, "context": {"outcomes": pack_outcomes([True, False, False]), "points": points_id(x, y)}}
    >>> cells, why = paired_cells(a, b)
    >>> cells, why.startswith("same 3 points")
    ((1, 1, 0, 1), True)
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


def points_id(x: torch.Tensor, y: torch.Tensor, indices: str | None = None) -> dict[str, Any]:
    """The id of a set of evaluated points: their row description, count and a SHA-256 of the inputs and labels.

    Args:
        x: the inputs as evaluated (their dtype, shape and bytes enter the hash).
        y: the labels (as int64).
        indices: which rows of which split they are, in words (default ``"x_test[0:n]"``).

    Returns:
        ``{"indices": ..., "n": ..., "sha256": ...}`` (JSON-able).
    """
    h = hashlib.sha256()
    xc = x.detach().cpu().contiguous()
    h.update(f"{xc.dtype}|{tuple(xc.shape)}|".encode())
    h.update(xc.numpy().tobytes())
    h.update(y.detach().cpu().to(torch.int64).contiguous().numpy().tobytes())
    return {"indices": indices or f"x_test[0:{len(y)}]", "n": len(y), "sha256": h.hexdigest()}


def pack_outcomes(flags: Sequence[bool] | torch.Tensor | np.ndarray) -> str:
    """Per-point booleans as a hexadecimal bitset (most significant bit first, zero-padded to whole bytes)."""
    arr = flags.detach().cpu().numpy() if isinstance(flags, torch.Tensor) else np.asarray(flags)
    return np.packbits(arr.astype(bool)).tobytes().hex()


def unpack_outcomes(bits: str, n: int) -> np.ndarray | None:
    """The n booleans of :func:`pack_outcomes`, or None when `bits` cannot be n points' outcomes (wrong length,
    not hexadecimal, padding bits set)."""
    if not isinstance(bits, str) or len(bits) != 2 * ((n + 7) // 8):
        return None
    try:
        raw = np.frombuffer(bytes.fromhex(bits), dtype=np.uint8)
    except ValueError:
        return None
    flags = np.unpackbits(raw)
    if flags[n:].any():
        return None
    return flags[:n].astype(bool)


def paired_cells(m1: dict[str, Any], m2: dict[str, Any]) -> tuple[tuple[int, int, int, int] | None, str]:
    """The 2×2 table (both robust, only OLD, only NEW, neither) of two recorded metrics measured on the same points.

    Args:
        m1, m2: two metrics as recorded (``k``, ``n``, ``context.outcomes``, ``context.points``).

    Returns:
        ``(cells, why)``: the cells when both carry per-point outcomes on points with the same id, each bitset
        holding exactly its own k of n successes; else None, and `why` says what kept them unpaired.
    """
    c1, c2 = m1.get("context", {}), m2.get("context", {})
    p1, p2 = c1.get("points"), c2.get("points")
    if not c1.get("outcomes") or not c2.get("outcomes") or not isinstance(p1, dict) or not isinstance(p2, dict):
        return None, "no per-point outcomes in " + ("either report" if not (c1.get("outcomes") or c2.get("outcomes"))
                                                   else "one report")
    if p1.get("sha256") != p2.get("sha256") or p1.get("n") != p2.get("n") or not p1.get("sha256"):
        return None, (f"different points ({p1.get('indices')}, sha256 {str(p1.get('sha256'))[:8]}… vs "
                      f"{p2.get('indices')}, sha256 {str(p2.get('sha256'))[:8]}…)")
    flags = []
    for m, c in ((m1, c1), (m2, c2)):
        n = m.get("n")
        f = unpack_outcomes(c["outcomes"], int(n)) if n == p1.get("n") and n else None
        if f is None or m.get("k") is None or int(f.sum()) != int(m["k"]):
            return None, "per-point outcomes inconsistent with the metric's own k of n"
        flags.append(f)
    a, b = flags
    cells = (int((a & b).sum()), int((a & ~b).sum()), int((~a & b).sum()), int((~a & ~b).sum()))
    return cells, f"same {p1['n']} points (sha256 {p1['sha256'][:8]}…)"
