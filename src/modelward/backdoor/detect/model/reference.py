"""Calibrating a model-level detector against clean reference models, class by class.

Neural Cleanse's anomaly index and MM-BD's p-value compare a model's classes *with each other*: their null is "the
other K − 1 classes of the same model". A class that is naturally easy to reach (a small trigger suffices, or its
logit margin can be driven higher than the others') is then indistinguishable from a backdoor target — on the
bench's synthetic RGB images that flags 4 of 10 clean models (docs/backdoor.md). The remedy is the reference the
defender can build: train a few clean models on their own data with the same recipe, run the detector on them, and
compare each class's statistic with *the same class* in those clean models.

For a detector with per-class statistics s_c (Neural Cleanse: the reversed mask's L1 norm, smaller is suspicious;
MM-BD: the maximum margin, larger is suspicious), with v_c = ±log s_c oriented so that larger is more suspicious
(log: the statistics are positive and scale with the model, so a ratio is the natural comparison):

    m_c = median of v_c over the R reference models
    σ   = 1.4826 · MAD of the leave-one-out residuals v_c^(j) − median_{i≠j} v_c^(i), pooled over j and c
    z_c = (v_c − m_c) / σ,   T = max_c z_c,   p = 1 − Φ(T)^K

— each class is standardised against its own clean distribution (the residuals are computed leave-one-out, so σ
includes the uncertainty of the reference median itself), and p is the Šidák correction of the largest of K
normal z-scores. The model is flagged when p < ``alpha``; the suspect is the class with the largest z. σ is pooled
over classes because R (a few models) is too small to estimate one per class.

This is a calibration of Neural Cleanse's (Wang et al., S&P 2019) and MM-BD's (Wang et al., S&P 2024) statistics,
not a new detector: the same per-class numbers, a null taken from clean models rather than from the other classes.
It needs R ≥ 3 reference models of the same data, architecture and training recipe as the model examined (the
references' per-class numbers come from the same detector settings); with fewer the residuals cannot be formed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from modelward.backdoor.detect.model.base import ModelVerdict
from modelward.errors import ConfigError

#: +1: a larger per-class statistic is more suspicious (MM-BD's margin); −1: a smaller one (Neural Cleanse's norm).
ORIENTATION: dict[str, int] = {"neural_cleanse": -1, "mmbd": 1}
MIN_REFERENCES = 3


class CleanReference:
    """The per-class null of one model-level detector, from clean reference models.

    Args:
        detector: ``"neural_cleanse"`` or ``"mmbd"`` (which per-class statistic, and its orientation).
        per_class: R × K, the detector's per-class statistics on R clean reference models (``ModelVerdict.per_class``).
        alpha: the p-value below which a model is flagged (0.05).

    Returns:
        A calibration: ``test(verdict)`` → a :class:`~modelward.backdoor.detect.model.base.ModelVerdict` named
        ``"<detector>_reference"`` (statistic −log10 p, threshold −log10 alpha, per-class z-scores).

    Example:
        >>> refs = [[12.0, 13.0, 12.5], [11.5, 12.8, 12.2], [12.3, 13.4, 12.9], [11.9, 12.9, 12.4]]
        >>> cal = CleanReference("neural_cleanse", refs)
        >>> v = ModelVerdict("neural_cleanse", 0.0, 2.0, False, 0, [3.0, 13.0, 12.5])
        >>> out = cal.test(v)
        >>> out.backdoored, out.suspect_class
        (True, 0)
    """

    def __init__(self, detector: str, per_class: Sequence[Sequence[float]], alpha: float = 0.05) -> None:
        if detector not in ORIENTATION:
            raise ConfigError(f"reference calibration: detector {detector!r} is not one of "
                              f"{', '.join(sorted(ORIENTATION))}")
        if not 0.0 < alpha < 1.0:
            raise ConfigError(f"reference calibration: alpha must be in (0, 1), got {alpha}")
        ref = np.asarray(per_class, dtype=np.float64)
        if ref.ndim != 2 or ref.shape[0] < MIN_REFERENCES or ref.shape[1] < 2:
            raise ConfigError(f"reference calibration ({detector}): needs at least {MIN_REFERENCES} clean reference "
                              f"models with ≥ 2 classes each, got an array of shape {ref.shape}")
        self.detector, self.alpha, self.reference = detector, alpha, ref
        v = self._oriented(ref)
        self.median = np.median(v, axis=0)
        resid = np.concatenate([v[j] - np.median(np.delete(v, j, axis=0), axis=0) for j in range(len(v))])
        self.sigma = max(1.4826 * float(np.median(np.abs(resid - np.median(resid)))), 1e-12)

    @classmethod
    def from_verdicts(cls, verdicts: Sequence[ModelVerdict], alpha: float = 0.05) -> CleanReference:
        """The calibration of the detector that produced ``verdicts`` (one per clean reference model)."""
        names = {v.detector for v in verdicts}
        if len(names) != 1:
            raise ConfigError(f"reference calibration: the verdicts come from {sorted(names) or 'no'} detector(s); "
                              "give one detector's verdicts")
        return cls(names.pop(), [v.per_class for v in verdicts], alpha)

    @property
    def classes(self) -> int:
        return int(self.reference.shape[1])

    def _oriented(self, s: np.ndarray) -> np.ndarray:
        if np.any(~np.isfinite(s)) or np.any(s <= 0):
            raise ConfigError(f"reference calibration ({self.detector}): per-class statistics must be finite and "
                              "positive (they are compared on a log scale)")
        return ORIENTATION[self.detector] * np.log(s)

    def z_scores(self, per_class: Sequence[float]) -> np.ndarray:
        """Each class's standardised deviation from the same class in the clean references (larger = more
        suspicious)."""
        s = np.asarray(per_class, dtype=np.float64)
        if s.shape != (self.classes,):
            raise ConfigError(f"reference calibration ({self.detector}): the model has {s.size} classes, the "
                              f"references {self.classes}; references must come from the same data and detector")
        return (self._oriented(s) - self.median) / self.sigma

    def p_value(self, per_class: Sequence[float]) -> tuple[float, int]:
        """p = 1 − Φ(max z)^K and the class of the largest z."""
        z = self.z_scores(per_class)
        k = int(np.argmax(z))
        # through the upper tail Q = 1 − Φ(T) (erfc, exact far out): 1 − (1 − Q)^K without cancellation
        q = 0.5 * math.erfc(float(z[k]) / math.sqrt(2.0))
        return float(min(max(-math.expm1(len(z) * math.log1p(-min(q, 1.0 - 1e-16))), 0.0), 1.0)), k

    def test(self, verdict: ModelVerdict) -> ModelVerdict:
        """The calibrated verdict of ``verdict`` (same detector, same per-class numbers)."""
        if verdict.detector != self.detector:
            raise ConfigError(f"reference calibration: references are {self.detector}'s, the verdict "
                              f"{verdict.detector}'s")
        p, k = self.p_value(verdict.per_class)
        stat = -math.log10(max(p, 1e-300))
        return ModelVerdict(f"{self.detector}_reference", stat, -math.log10(self.alpha), p < self.alpha, k,
                            [float(v) for v in self.z_scores(verdict.per_class)], p_value=p,
                            seconds=verdict.seconds,
                            extra={"references": int(self.reference.shape[0]), "sigma": self.sigma,
                                   "uncalibrated_statistic": verdict.statistic,
                                   "uncalibrated_backdoored": verdict.backdoored})

    def to_dict(self) -> dict[str, Any]:
        return {"detector": self.detector, "alpha": self.alpha, "per_class": self.reference.tolist(),
                "sigma": self.sigma}


def reference_from_detect_json(results: Sequence[dict[str, Any]], detector: str,
                               alpha: float = 0.05) -> CleanReference:
    """A :class:`CleanReference` from the ``detect.json`` contents of clean reference models (``modelward backdoor
    detect`` on each): their ``verdicts`` of ``detector``."""
    rows = []
    for i, res in enumerate(results):
        found = [v for v in res.get("verdicts", []) if v.get("detector") == detector]
        if not found:
            raise ConfigError(f"reference {i}: no {detector} verdict in its detect.json (run `modelward backdoor "
                              f"detect` on the clean reference model with {detector} enabled)")
        rows.append(found[0]["per_class"])
    return CleanReference(detector, rows, alpha)


__all__ = ["ORIENTATION", "CleanReference", "reference_from_detect_json"]
