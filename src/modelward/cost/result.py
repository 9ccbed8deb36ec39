"""One backend's measurement (a row of the cost table) and the agreement check every row must pass."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from modelward.errors import ModelwardError

NAN = float("nan")


class PrecisionError(ModelwardError):
    """An encrypted / secret-shared / split path disagrees with plaintext beyond its stated precision."""


@dataclass
class BackendResult:
    """What one backend measured on the same model and inputs.

    ``status`` is ``ok``, ``unavailable`` (library not installed / does not import), ``unsupported`` (the model has
    a layer the backend cannot run, cannot be cut, or is too deep), ``error`` (a party process failed) or
    ``FAILED`` (outputs drifted beyond the stated precision: no speed is reported then). Latencies are medians over repeats; bytes are measured on the real transport.
    """

    backend: str
    status: str = "ok"
    reason: str = ""
    latency_sample_s: float = NAN  # one sample, end to end (encrypt/share … decrypt/reveal)
    latency_batch_s: float = NAN  # one batch of `batch_size` samples
    batch_size: int = 0
    bytes_per_sample: float = NAN  # on the wire, per sample, in the batch run
    setup_bytes: float = NAN  # one-time bytes (HE evaluation keys, MPC weight shares); not in bytes_per_sample
    setup_s: float = NAN  # one-time set-up (key generation, process start, connections)
    max_abs_diff: float = NAN  # vs plain PyTorch on the same inputs
    tolerance: float = NAN
    precision: str = ""  # the stated precision (how `tolerance` is derived)
    params: str = ""  # security / numeric parameters
    multiplications: int = 0  # scalar multiplications of one sample's forward pass
    outputs: np.ndarray | None = field(default=None, repr=False)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        """Samples per second in the batch run."""
        if not self.batch_size or not math.isfinite(self.latency_batch_s) or self.latency_batch_s <= 0:
            return NAN
        return self.batch_size / self.latency_batch_s

    def fail(self, reason: str) -> BackendResult:
        """Mark FAILED and drop the speed numbers (a wrong answer has no meaningful speed)."""
        self.status, self.reason = "FAILED", reason
        self.latency_sample_s = self.latency_batch_s = self.bytes_per_sample = NAN
        return self


def check_agreement(backend: str, out: np.ndarray, ref: np.ndarray, tol: float, precision: str) -> float:
    """Largest |out − ref|; raises :class:`PrecisionError` beyond `tol` (the backend's stated precision).

    Args:
        backend: named in the error.
        out, ref: (n, classes) outputs of the backend and of plain PyTorch on the same inputs.
        tol: the allowed absolute difference.
        precision: how `tol` was derived, quoted in the error.
    Returns:
        the largest absolute difference.
    Example:
        >>> check_agreement("he", np.ones((2, 2)), np.ones((2, 2)), 1e-3, "CKKS 2^-40")
        0.0
    """
    out, ref = np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape:
        raise PrecisionError(f"{backend}: output shape {out.shape} differs from plain {ref.shape}")
    if not np.isfinite(out).all():
        raise PrecisionError(f"{backend}: non-finite outputs (overflow of the encrypted/shared computation)")
    diff = float(np.abs(out - ref).max()) if out.size else 0.0
    if diff > tol:
        i = np.unravel_index(int(np.abs(out - ref).argmax()), out.shape)
        raise PrecisionError(f"{backend}: outputs drift from plaintext by {diff:.3g} > stated precision "
                             f"{tol:.3g} ({precision}); e.g. sample {i[0]} output {i[1]}: {out[i]:.6g} vs "
                             f"plain {ref[i]:.6g}. Not reporting a speed for a wrong answer.")
    return diff


def median_time(fn: Callable[[], object], repeats: int, warmup: bool = True) -> tuple[float, object]:
    """Median wall time of `repeats` calls (after one untimed warm-up call) and the last call's result."""
    if warmup:
        fn()
    ts, out = [], None
    for _ in range(max(1, repeats)):
        t = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts), out
