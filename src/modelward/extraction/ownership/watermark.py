"""Answer watermarks (DAWN: Szyller, Atli, Marchal & Asokan, "DAWN: Dynamic Adversarial Watermarking of Neural
Networks", ACM MM 2021, §4).

A keyed hash of each query row selects a small fraction of answers; for those rows the answer is changed
deterministically so that its top-1 names another class (the same query always gets the same changed answer,
so repeating a query reveals nothing). A model trained on the answers inherits some of these wrong labels.

The hash is ``HMAC-SHA256(key, b"row" ‖ float32 little-endian bytes of the row)``; its first 8 bytes read as an
integer ``u`` select the row when ``u / 2^64 < fraction``, and the next 8 bytes pick the watermark label uniformly
among the K − 1 classes other than the answer's top-1.

**Why the verification p-value is valid.** For an innocent model ``s`` (one that never saw the key's answers),
its scores at ``x`` do not depend on the key, while the watermark class ``w(x)`` is uniform over the K − 1 classes
other than the owner's top-1 ``t(x)`` and independent across distinct rows (a pseudo-random function of the key).
Two statistics follow, both with an exact or conservative Binomial(n, 1/(K − 1)) null over n distinct rows:

* **label-only suspect**: a *match* is ``s(x) = w(x)``; ``P(match) = 1[s(x) ≠ t(x)] / (K − 1) ≤ 1/(K − 1)``;
* **suspect with scores** (probabilities or logits): a *match* is "w(x) has the strictly highest score among the
  K − 1 classes other than t(x)"; the rank of a uniform w among those K − 1 classes is uniform, so
  ``P(match) = 1/(K − 1)`` (a tie counts as no match, which only lowers it). This catches a copy that learned
  the mark only partly (w second to t): on the digits CNN, a KnockoffNets copy made from 3,000 queries through
  ModelGuard-S ranked w first among the others at 16 of its 19 marked rows, and predicted w at 9 (BENCHMARKS.md).

:func:`watermark_p_value` is the binomial tail: a p-value for "the suspect is independent of this key's answers".
"""

from __future__ import annotations

import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from scipy.stats import binom
from torch import Tensor

from modelward.errors import ConfigError, DataError

MAX_FRACTION = 0.005  # issue #30: at most 0.5 % of answers are changed
KEY_BYTES = 32


def new_key() -> bytes:
    """A fresh 256-bit watermark key (never leaves the owner)."""
    return secrets.token_bytes(KEY_BYTES)


def load_or_create_key(path: Path) -> bytes:
    """Read the owner's key from ``path`` (raw 32 bytes), creating it (mode 0600, atomically) if missing.

    Args:
        path: the key file, kept in the guard's state folder.

    Returns:
        The key bytes.
    """
    path = Path(path)
    if path.is_file():
        key = path.read_bytes()
        if len(key) != KEY_BYTES:
            raise DataError(f"{path}: a watermark key is {KEY_BYTES} bytes, found {len(key)}; restore it from a backup "
                            "or delete it to start a new watermark (earlier marks then no longer verify)")
        return key
    path.parent.mkdir(parents=True, exist_ok=True)
    key = new_key()
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with open(fd, "wb", closefd=True) as fh:
            fh.write(key)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return key


@dataclass(frozen=True)
class MarkedAnswers:
    """The answers after watermarking and which rows were marked.

    Args:
        probs: the B × K answers (marked rows changed).
        marked: bool vector, True where the row was marked.
        labels: the watermark class of each marked row, −1 elsewhere.
    """

    probs: Tensor
    marked: Tensor
    labels: Tensor


class AnswerWatermark:
    """Keyed, deterministic answer watermark for a prediction API (DAWN §4).

    A marked row's answer swaps the probability of its top-1 class with that of a keyed class w, uniform over the
    K − 1 other classes: the answer stays on the simplex, keeps its shape, and its top-1 becomes w. A model trained
    on the answers tends to learn w at the marked rows (a ranked variant with keyed masses on three classes was
    tried and dropped: a KnockoffNets copy learned the keyed top-1 of fewer rows and none of the rankings).

    Args:
        key: the owner's secret (≥ 16 bytes; :func:`new_key`).
        fraction: the share of rows marked, 0 < fraction ≤ 0.005.

    Returns:
        ``select(x)``: which rows are marked; ``marks(x, top1, K)``: the keyed class of any rows;
        ``apply(x, probs)``: :class:`MarkedAnswers`.

    Example:
        >>> import torch
        >>> wm = AnswerWatermark(b"k" * 32, fraction=0.005)
        >>> out = wm.apply(torch.rand(1000, 4), torch.softmax(torch.randn(1000, 3), 1))
        >>> 0 <= int(out.marked.sum()) <= 20
        True
    """

    def __init__(self, key: bytes, fraction: float = MAX_FRACTION) -> None:
        if not isinstance(key, bytes | bytearray) or len(key) < 16:
            raise ConfigError("watermark key: expected at least 16 bytes (use modelward.extraction.ownership.new_key())")
        if not 0.0 < fraction <= MAX_FRACTION:
            raise ConfigError(f"watermark fraction: must be in (0, {MAX_FRACTION}] (at most 0.5 % of answers are "
                              f"changed), got {fraction}")
        self._key = bytes(key)
        self.fraction = float(fraction)
        self._threshold = int(self.fraction * 2**64)

    def _digests(self, x: Tensor) -> list[bytes]:
        rows = x.detach().to("cpu", torch.float32).reshape(len(x), -1).numpy().astype("<f4", copy=False)
        # hmac.digest: the one-shot C path (OpenSSL), the same bytes as hmac.new(...).digest() at a fraction of the
        # cost per row (no HMAC object per row): measurable on the guard's request path (issue 40)
        key = self._key
        return [hmac.digest(key, b"row" + r.tobytes(), "sha256") for r in rows]

    def select(self, x: Tensor) -> np.ndarray:
        """Which rows of ``x`` are marked (a bool vector)."""
        u = np.array([int.from_bytes(d[:8], "big") for d in self._digests(x)], dtype=np.uint64)
        return u < np.uint64(self._threshold)

    def marks(self, x: Tensor, top1: Tensor, num_classes: int) -> Tensor:
        """The keyed class w of every row of ``x``, uniform over the K − 1 classes other than ``top1``."""
        if num_classes < 2:
            raise DataError(f"num_classes must be >= 2, got {num_classes}")
        draw = torch.tensor([int.from_bytes(d[8:16], "big") % (num_classes - 1) for d in self._digests(x)],
                            dtype=torch.long)
        return draw + (draw >= top1.cpu().long()).long()  # skip the top-1 class

    def apply(self, x: Tensor, probs: Tensor) -> MarkedAnswers:
        """Watermark a batch of answers ``probs`` (B × K) to the queries ``x`` (B × ...)."""
        if len(x) != len(probs):
            raise DataError(f"watermark: {len(x)} queries but {len(probs)} answers")
        marked = torch.from_numpy(self.select(x))
        labels = torch.full((len(x),), -1, dtype=torch.long)
        if not marked.any():
            return MarkedAnswers(probs, marked, labels)
        rows = marked.nonzero().flatten()
        top = probs[rows].argmax(1)
        lab = self.marks(x[rows], top, probs.shape[1])
        out = probs.clone()
        p_top = out[rows, top].clone()
        out[rows, top] = out[rows, lab]
        out[rows, lab] = p_top
        labels[rows] = lab
        return MarkedAnswers(out, marked, labels)


def watermark_p_value(matches: int, n: int, num_classes: int) -> float:
    """P[Binomial(n, 1/(K−1)) ≥ matches]: the conservative p-value that an innocent model predicts the keyed class
    of ``n`` distinct marked rows ``matches`` times (see the module docstring).

    Args:
        matches: rows where the suspect's top-1 equals the keyed class.
        n: distinct marked rows queried.
        num_classes: K.

    Returns:
        The p-value (1.0 when n = 0).

    Example:
        >>> round(watermark_p_value(0, 10, 10), 3)
        1.0
        >>> watermark_p_value(7, 7, 10) < 1e-6
        True
    """
    if num_classes < 2:
        raise DataError(f"num_classes must be >= 2, got {num_classes}")
    if n <= 0:
        return 1.0
    return float(binom.sf(matches - 1, n, 1.0 / (num_classes - 1)))
