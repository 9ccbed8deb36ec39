"""The guard's ownership side: it watermarks answers, records the marked rows, and runs the PRADA detector per
API key. Its rows live in the guard's store (``state_dir/queries.sqlite``) and are written inside the request's
own transaction — with the charge, the centroids and the log row — so an answer that left the server always has
its marks and detector state on disk, and a failed request leaves none (kill -9 loses nothing that was served).
The detector's state is bounded per key and in memory (:mod:`modelward.extraction.ownership.detector`).
The watermark key lives in ``state_dir`` (mode 0600) and never leaves it; the fingerprint, when made
(``modelward guard fingerprint``), is stored beside it.

Nothing here is pickled: rows are float32 bytes, keys raw bytes, fingerprints safetensors.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from modelward.core.config import StrictModel
from modelward.core.data import DataConfig
from modelward.core.train import TrainConfig
from modelward.errors import ConfigError, DataError
from modelward.extraction.guard.errors import GuardError
from modelward.extraction.guard.store import SQLStore, Transaction
from modelward.extraction.ownership.detector import DetectorVerdict, KeyState, PradaDetector, PradaUpdate
from modelward.extraction.ownership.verify import WatermarkRecords
from modelward.extraction.ownership.watermark import MAX_FRACTION, AnswerWatermark, load_or_create_key

log = logging.getLogger("modelward.guard")


class WatermarkSection(StrictModel):
    """``[ownership.watermark]``: keyed answer watermark (DAWN); ``fraction`` ≤ 0.005 of answers change."""

    enabled: bool = True
    fraction: float = Field(MAX_FRACTION, gt=0.0, le=MAX_FRACTION)
    key_file: str = "watermark.key"  # relative to server.state_dir; created (0600) on first start


class DetectorSection(StrictModel):
    """``[ownership.detector]``: PRADA per API key; ``action``: log | alert (status endpoint) | refuse.

    The defaults are the calibration of docs/guard.md (``bench/prada_calibration.py``): at most 1 false alarm in 100
    natural streams of each shape measured, JBDA streams flagged after about 200 queries."""

    enabled: bool = True
    delta: float = Field(0.92, gt=0.0, lt=1.0)  # Shapiro–Wilk threshold on log distances
    min_queries: int = Field(100, ge=3)
    action: Literal["log", "alert", "refuse"] = "alert"
    max_stored_rows: int = Field(2000, ge=10)  # per key: PRADA's growing sets stop growing here
    window: int = Field(1000, ge=3)  # distances tested (the latest)
    consecutive: int = Field(6, ge=1)  # successive tests below delta that flag (at or above it: that clear)
    test_every: int = Field(32, ge=1)  # new distances between two tests
    clear_after_minutes: float = Field(60.0, ge=0.0)  # a flag (and a refusal) ends after this; 0 = only by tests
    max_memory_mb: float = Field(256.0, gt=0.0)  # all keys' states in memory; the least recently used are evicted


class FingerprintSection(StrictModel):
    """``[ownership.fingerprint]``: where ``guard fingerprint`` stores the boundary fingerprint, and how it is made:
    reference models of the served architecture are trained independently on ``data`` with ``train`` (the owner's
    own recipe), seeds ``reference_seed``, ``reference_seed + 1``, …"""

    file: str = "fingerprint.safetensors"  # relative to server.state_dir
    data: DataConfig | None = None  # the owner's data (paths relative to the working directory, as elsewhere)
    train: TrainConfig = Field(default_factory=TrainConfig)
    reference_seed: int = 1000
    points: int = Field(100, ge=10)
    candidates: int = Field(600, ge=10)
    selection_references: int = Field(3, ge=1)
    calibration_references: int = Field(8, ge=2)
    kappa: float = Field(2.0, gt=0.0)


class OwnershipSection(StrictModel):
    watermark: WatermarkSection = Field(default_factory=WatermarkSection)
    detector: DetectorSection = Field(default_factory=DetectorSection)
    fingerprint: FingerprintSection = Field(default_factory=FingerprintSection)


class ExtractionSuspected(GuardError):
    """A key the detector flagged, under ``action = "refuse"`` (code ``extraction_suspected``, HTTP 403)."""

    def __init__(self, key: str, at: int | None) -> None:
        super().__init__("extraction_suspected", f"API key {key!r} is refused: its query stream looks like a "
                         f"model-extraction attack (PRADA, flagged after {at} queries); ask the operator")


@dataclass(frozen=True)
class KeyStatus:
    key: str
    queries: int
    shapiro_w: float | None
    flagged: bool
    flagged_at: int | None  # first flagged at this query count (kept when the flag clears)
    flags: int  # times flagged


class GuardOwnership:
    """Watermark + detector for one guard, persisted in the guard's store (shared by replicas on PostgreSQL).

    A request runs :meth:`begin` (inside its transaction, before the model: reads the key's detector state, refuses
    a flagged key under ``action = "refuse"``), then :meth:`after` (watermarks the answers, judges the batch, writes
    the marks and the detector's rows into the same transaction) and, once the transaction committed,
    :meth:`commit`. A request that fails never calls :meth:`commit`: its detector update is dropped, memory still
    matches the store, and nothing is re-read (an error costs O(1), whatever the history).

    Args:
        cfg: the ``[ownership]`` section.
        state_dir: the guard's state folder (the watermark key file).
        num_classes: K.
        store: the guard's store.

    Returns:
        ``before(key)``, ``begin(txn, key)``, ``after(txn, key, x, probs, y_hat)`` → (answers, pending update),
        ``commit(pending)``, ``status()``, ``marked_rows()``.
    """

    def __init__(self, cfg: OwnershipSection, state_dir: Path, num_classes: int, store: SQLStore) -> None:
        self.cfg, self.num_classes = cfg, num_classes
        self.state_dir = Path(state_dir)
        self.store = store
        self.watermark = None
        if cfg.watermark.enabled:
            key = load_or_create_key(self.state_dir / cfg.watermark.key_file)
            digest = hashlib.sha256(key).hexdigest()
            pinned = store.pin("watermark_key_sha256", digest) if store.shared else None
            if pinned is not None and pinned != digest:
                raise ConfigError(
                    f"ownership.watermark.key_file: {self.state_dir / cfg.watermark.key_file} is not the watermark "
                    f"key the other replicas of this store use (SHA-256 {pinned[:12]}…); copy their key file here "
                    "(mode 0600) so every replica marks answers with one key")
            self.watermark = AnswerWatermark(key, cfg.watermark.fraction)
        d = cfg.detector
        self._txn: Transaction | None = None  # the request's open transaction (the detector reads through it)
        self.detector = PradaDetector(
            d.delta, d.min_queries, d.max_stored_rows, window=d.window, consecutive=d.consecutive,
            test_every=d.test_every, clear_after_s=d.clear_after_minutes * 60.0 or None,
            max_memory_mb=d.max_memory_mb, loader=self._load) if d.enabled else None

    def _load(self, key: str, cached: KeyState | None) -> KeyState | None:
        if self._txn is not None:
            return self._txn.detector_state(key, cached)
        return cached  # outside a request (a pre-check): what memory holds

    # -- the request path -------------------------------------------------------------------------------------
    def before(self, key: str) -> None:
        """Refuse a key flagged under ``action = "refuse"`` from memory, before any work (nothing charged). The
        authoritative check is :meth:`begin`'s, on the stored state."""
        if self.detector is not None and self.cfg.detector.action == "refuse":
            self._refuse_if_flagged(key, self.detector.verdict(key))

    def _refuse_if_flagged(self, key: str, v: DetectorVerdict) -> None:
        if not v.flagged or v.flag_time is None:
            return
        hold = self.detector.clear_after_s if self.detector is not None else None
        if hold is None or time.time() - v.flag_time < hold:
            raise ExtractionSuspected(key, v.flagged_at)

    def begin(self, txn: Transaction, key: str) -> None:
        """Inside the request's transaction, before the model runs: read the key's detector state (current, also
        when another replica changed it) and refuse a flagged key under ``action = "refuse"``."""
        if self.detector is None:
            return
        self._txn = txn
        try:
            self.detector.state(key)
        finally:
            self._txn = None
        if self.cfg.detector.action == "refuse":
            self._refuse_if_flagged(key, self.detector.verdict(key))

    def after(self, txn: Transaction, key: str, x: Tensor, probs: Tensor,
              y_hat: Tensor) -> tuple[Tensor, PradaUpdate | None]:
        """Watermark the answers and judge the queries; their rows are written into the request's open
        transaction. Returns the answers to send and the detector update to :meth:`commit` once it committed."""
        top1 = probs.argmax(1)
        out = y_hat
        if self.watermark is not None:
            marked = self.watermark.apply(x, y_hat)
            out = marked.probs
            if marked.marked.any():
                xs = x.detach().to("cpu", torch.float32)
                shape = ",".join(str(s) for s in xs.shape[1:])
                rows = []
                for i in marked.marked.nonzero().flatten().tolist():
                    blob = xs[i].numpy().astype("<f4").tobytes()
                    rows.append((hashlib.sha256(blob).digest(), key, time.time(), shape, blob,
                                 int(marked.labels[i]), int(top1[i])))
                txn.insert_marks(rows)
        update = None
        if self.detector is not None:
            self._txn = txn
            try:
                update = self.detector.prepare(key, x, top1)
            finally:
                self._txn = None
            txn.write_detector(update, self.detector.window)
            if update.newly_flagged:
                log.warning("extraction detector: key %r flagged after %s queries (Shapiro-Wilk W = %.3f < %s in %d "
                            "tests); action: %s", key, update.queries, update.last_w or float("nan"),
                            self.cfg.detector.delta, self.cfg.detector.consecutive, self.cfg.detector.action)
        return out, update

    def commit(self, update: PradaUpdate | None) -> None:
        """The request's transaction committed: apply its detector update in memory (O(its rows))."""
        if update is not None and self.detector is not None:
            self.detector.apply(update)

    # -- operators --------------------------------------------------------------------------------------------
    def status(self) -> list[KeyStatus]:
        """Every key the detector has a state for (in the store: also keys evicted from memory), with its verdict."""
        if self.detector is None:
            return []
        return [KeyStatus(*row) for row in self.store.detector_summary()]

    def marked_rows(self) -> int:
        return self.store.marked_rows()


def read_marks(store: Path | SQLStore, num_classes: int) -> WatermarkRecords:
    """The marked rows recorded in the guard's store: an SQLite file (opened read-only: safe beside a running
    server) or an open store (PostgreSQL)."""
    if isinstance(store, SQLStore):
        rows = store.marks()
    else:
        path = Path(store)
        if not path.is_file():
            raise DataError(f"{path}: no guard store there (serve the model with [ownership.watermark] enabled first)")
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10.0)
        try:
            has = db.execute("SELECT name FROM sqlite_master WHERE type='table' AND name='marks'").fetchone()
            rows = db.execute("SELECT shape, x, mark, top1 FROM marks ORDER BY time, digest").fetchall() if has else []
        finally:
            db.close()
    if not rows:
        return WatermarkRecords(torch.empty(0), torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long),
                                num_classes)
    shape = tuple(int(s) for s in rows[0][0].split(",") if s)
    x = torch.stack([torch.from_numpy(np.frombuffer(r[1], dtype="<f4").copy()).reshape(shape) for r in rows])
    return WatermarkRecords(x, torch.tensor([r[2] for r in rows]), torch.tensor([r[3] for r in rows]), num_classes)
