"""The guard's ownership side: it watermarks answers, records the marked rows, and runs the PRADA detector per
API key. Its rows live in the guard's store (``state_dir/queries.sqlite``) and are written inside the request's
own transaction — with the charge, the centroids and the log row — so an answer that left the server always has
its marks and detector events on disk, and a failed request leaves none (kill -9 loses nothing that was served).
The watermark key lives in ``state_dir`` (mode 0600) and never leaves it; the fingerprint, when made
(``modelward guard fingerprint``), is stored beside it.

Nothing here is pickled: rows are float32 bytes, keys raw bytes, fingerprints safetensors.
"""

from __future__ import annotations

import hashlib
import logging
import math
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from modelward.core.config import StrictModel
from modelward.core.data import DataConfig
from modelward.core.train import TrainConfig
from modelward.errors import DataError
from modelward.extraction.ownership.detector import PradaDetector, PradaEvent
from modelward.extraction.ownership.verify import WatermarkRecords
from modelward.extraction.ownership.watermark import MAX_FRACTION, AnswerWatermark, load_or_create_key

log = logging.getLogger("modelward.guard")


class WatermarkSection(StrictModel):
    """``[ownership.watermark]``: keyed answer watermark (DAWN); ``fraction`` ≤ 0.005 of answers change."""

    enabled: bool = True
    fraction: float = Field(MAX_FRACTION, gt=0.0, le=MAX_FRACTION)
    key_file: str = "watermark.key"  # relative to server.state_dir; created (0600) on first start


class DetectorSection(StrictModel):
    """``[ownership.detector]``: PRADA per API key; ``action``: log | alert (status endpoint) | refuse."""

    enabled: bool = True
    delta: float = Field(0.93, gt=0.0, lt=1.0)
    min_queries: int = Field(100, ge=3)
    action: Literal["log", "alert", "refuse"] = "alert"
    max_stored_rows: int = Field(5000, ge=10)  # per key: PRADA's growing sets stop growing here


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


class ExtractionSuspected(Exception):
    """A key the detector flagged, under ``action = "refuse"``."""

    def __init__(self, key: str, at: int | None) -> None:
        super().__init__(f"API key {key!r} is refused: its query stream looks like a model-extraction attack "
                         f"(PRADA, flagged after {at} queries); ask the operator")


_SCHEMA = """
CREATE TABLE IF NOT EXISTS marks (digest BLOB PRIMARY KEY, key TEXT, time REAL, shape TEXT, x BLOB,
                                  mark INTEGER, top1 INTEGER);
CREATE TABLE IF NOT EXISTS prada_events (key TEXT, seq INTEGER, cls INTEGER, d_min REAL, admitted INTEGER,
                                         batch_end INTEGER, vec BLOB, PRIMARY KEY (key, seq));
CREATE TABLE IF NOT EXISTS prada_flags (key TEXT PRIMARY KEY, flagged_at INTEGER, shapiro_w REAL, time REAL);
"""


@dataclass(frozen=True)
class KeyStatus:
    key: str
    queries: int
    shapiro_w: float | None
    flagged: bool
    flagged_at: int | None


class GuardOwnership:
    """Watermark + detector for one guard, persisted in ``state_dir/ownership.sqlite``.

    Args:
        cfg: the ``[ownership]`` section.
        state_dir: the guard's state folder.
        num_classes: K.

    Returns:
        ``before(key)`` (raises :class:`ExtractionSuspected` for a refused key), ``after(key, x, probs, y_hat)``
        → the answers to send, ``status()``, ``records()``, ``close()``.
    """

    def __init__(self, cfg: OwnershipSection, state_dir: Path, num_classes: int, db: sqlite3.Connection) -> None:
        self.cfg, self.num_classes = cfg, num_classes
        self.state_dir = Path(state_dir)
        self.watermark = (AnswerWatermark(load_or_create_key(self.state_dir / cfg.watermark.key_file),
                                          cfg.watermark.fraction) if cfg.watermark.enabled else None)
        self._db = db  # the guard's store; the caller serialises access to it
        for stmt in _SCHEMA.strip().split(";"):
            if stmt.strip():
                self._db.execute(stmt)
        self._lock = threading.Lock()
        self._reload()

    def _reload(self) -> None:
        d = self.cfg.detector
        self.detector = PradaDetector(d.delta, d.min_queries, d.max_stored_rows) if d.enabled else None
        self._seq: dict[str, int] = {}
        if self.detector is not None:
            self._replay()

    # -- persistence ------------------------------------------------------------------------------------------
    def _replay(self) -> None:
        assert self.detector is not None
        rows = self._db.execute("SELECT key, seq, cls, d_min, admitted, batch_end, vec FROM prada_events "
                                "ORDER BY key, seq").fetchall()
        by_key: dict[str, list[PradaEvent]] = {}
        for key, seq, cls, d_min, admitted, batch_end, vec in rows:
            v = np.frombuffer(vec, dtype="<f4").copy() if vec is not None else None
            by_key.setdefault(key, []).append(PradaEvent(int(cls), math.nan if d_min is None else float(d_min),
                                                         bool(admitted), v, bool(batch_end)))
            self._seq[key] = int(seq) + 1
        for key, events in by_key.items():
            self.detector.replay(key, events)

    # -- the request path -------------------------------------------------------------------------------------
    def before(self, key: str) -> None:
        """Refuse a flagged key when the action is ``refuse`` (nothing charged)."""
        if self.detector is not None and self.cfg.detector.action == "refuse":
            v = self.detector.verdict(key)
            if v.flagged:
                raise ExtractionSuspected(key, v.flagged_at)

    def after(self, key: str, x: Tensor, probs: Tensor, y_hat: Tensor) -> Tensor:
        """Watermark the answers and observe the queries; their rows are written on the guard's store inside the
        caller's open transaction (which commits or rolls back with the request). Returns the answers to send.
        If the transaction rolls back, call :meth:`rollback` so memory matches the store again."""
        top1 = probs.argmax(1)
        out = y_hat
        marked_rows: list[tuple[Any, ...]] = []
        if self.watermark is not None:
            marked = self.watermark.apply(x, y_hat)
            out = marked.probs
            if marked.marked.any():
                xs = x.detach().to("cpu", torch.float32)
                shape = ",".join(str(s) for s in xs.shape[1:])
                for i in marked.marked.nonzero().flatten().tolist():
                    blob = xs[i].numpy().astype("<f4").tobytes()
                    marked_rows.append((hashlib.sha256(blob).digest(), key, time.time(), shape, blob,
                                        int(marked.labels[i]), int(top1[i])))
        with self._lock:
            events: list[PradaEvent] = []
            flag_row = None
            if self.detector is not None:
                before = self.detector.verdict(key).flagged
                verdict, events = self.detector.observe(key, x, top1)
                if verdict.flagged and not before:
                    flag_row = (key, verdict.flagged_at, verdict.shapiro_w, time.time())
                    log.warning("extraction detector: key %r flagged after %s queries (Shapiro-Wilk W = %.3f < %s); "
                                "action: %s", key, verdict.flagged_at, verdict.shapiro_w or float("nan"),
                                self.cfg.detector.delta, self.cfg.detector.action)
            seq0 = self._seq.get(key, 0)
            ev_rows = [(key, seq0 + j, e.cls, None if math.isnan(e.d_min) else e.d_min, int(e.admitted),
                        int(e.batch_end), None if e.vector is None else e.vector.astype("<f4").tobytes())
                       for j, e in enumerate(events)]
            self._seq[key] = seq0 + len(events)
        if marked_rows:
            self._db.executemany("INSERT OR IGNORE INTO marks VALUES (?, ?, ?, ?, ?, ?, ?)", marked_rows)
        if ev_rows:
            self._db.executemany("INSERT INTO prada_events VALUES (?, ?, ?, ?, ?, ?, ?)", ev_rows)
        if flag_row is not None:
            self._db.execute("INSERT OR REPLACE INTO prada_flags VALUES (?, ?, ?, ?)", flag_row)
        return out

    def rollback(self) -> None:
        """The request's transaction rolled back: rebuild the detector from the rows the store holds."""
        with self._lock:
            self._reload()

    # -- operators --------------------------------------------------------------------------------------------
    def status(self) -> list[KeyStatus]:
        """Every key the detector has seen, with its verdict."""
        if self.detector is None:
            return []
        out = []
        for k in self.detector.clients():
            v = self.detector.verdict(k)
            out.append(KeyStatus(k, v.queries, v.shapiro_w, v.flagged, v.flagged_at))
        return out

    def marked_rows(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM marks").fetchone()[0])


def read_marks(store: Path, num_classes: int) -> WatermarkRecords:
    """The marked rows recorded in the guard's store (opened read-only: safe beside a running server)."""
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
