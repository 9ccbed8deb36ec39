"""The guard's ownership mechanism around a local victim: what an attacker gets from ``guard serve`` (defense,
then the answer watermark) and what the owner records (marked rows, the detector's view of the stream), without
HTTP — for studies, the security report and benchmarks. The serving path applies the same two steps in
:class:`~modelward.extraction.guard.ownership.GuardOwnership`."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from modelward.extraction.defenses.base import PredictionDefense
from modelward.extraction.ownership.detector import DetectorVerdict, PradaDetector
from modelward.extraction.ownership.verify import WatermarkRecords
from modelward.extraction.ownership.watermark import AnswerWatermark
from modelward.extraction.victim import LocalVictim


class WatermarkedVictim(LocalVictim):
    """A :class:`~modelward.extraction.victim.LocalVictim` whose answers carry the answer watermark, observed by a
    PRADA detector.

    Args:
        model: the victim classifier.
        defense: the prediction-perturbation defense applied first (as in the guard).
        watermark: the owner's :class:`AnswerWatermark`.
        detector: a :class:`PradaDetector` watching this client's stream (None: no detector).
        num_classes: K.

    Returns:
        A victim; ``records()`` → the marked rows for :func:`~modelward.extraction.ownership.verify_ownership`,
        ``verdict()`` → the detector's view.

    Example:
        >>> import torch
        >>> from modelward.extraction.ownership import new_key
        >>> v = WatermarkedVictim(torch.nn.Linear(4, 3), None, AnswerWatermark(new_key()), num_classes=3)
        >>> v.query(torch.rand(5, 4)).shape
        torch.Size([5, 3])
    """

    def __init__(self, model: nn.Module, defense: PredictionDefense | None, watermark: AnswerWatermark,
                 detector: PradaDetector | None = None, num_classes: int | None = None,
                 client: str = "attacker") -> None:
        super().__init__(model, defense, num_classes=num_classes)
        self.watermark, self.detector, self.client = watermark, detector, client
        self._x: list[Tensor] = []
        self._marks: list[Tensor] = []
        self._top: list[Tensor] = []

    @torch.no_grad()
    def query(self, x: Tensor) -> Tensor:
        y_hat = super().query(x)
        top1 = self.clean(x).argmax(1)
        out = self.watermark.apply(x, y_hat)
        m = out.marked
        self._x.append(x[m].detach().cpu())
        self._marks.append(out.labels[m])
        self._top.append(top1[m].cpu())
        if self.detector is not None:
            self.detector.observe(self.client, x, top1)
        return out.probs

    def records(self) -> WatermarkRecords:
        """The distinct rows marked so far (duplicates kept once, as in the guard's store)."""
        if not self._x:
            return WatermarkRecords(torch.empty(0), torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long),
                                    self.num_classes)
        x, marks, top = torch.cat(self._x), torch.cat(self._marks), torch.cat(self._top)
        seen: set[bytes] = set()
        keep = []
        for i in range(len(x)):
            b = x[i].numpy().tobytes()
            if b not in seen:
                seen.add(b)
                keep.append(i)
        idx = torch.tensor(keep, dtype=torch.long)
        return WatermarkRecords(x[idx], marks[idx], top[idx], self.num_classes)

    def verdict(self) -> DetectorVerdict | None:
        return None if self.detector is None else self.detector.verdict(self.client)
