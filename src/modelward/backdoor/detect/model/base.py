"""The verdict of a model-level detector: its statistic, the threshold it is compared with, and the class it
suspects."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class ModelVerdict:
    """One detector's verdict on one model.

    Attributes:
        detector: its name (``"neural_cleanse"``, ``"mmbd"``).
        statistic: the number the verdict is read from (Neural Cleanse: anomaly index of the smallest trigger;
            MM-BD: −log10 of the p-value, so larger means more suspicious for both).
        threshold: the statistic above which the model is called backdoored (the literature's value).
        backdoored: ``statistic > threshold``.
        suspect_class: the class a backdoor would target (the most anomalous one), whatever the verdict.
        per_class: the per-class numbers the statistic was computed from (trigger L1 norms, maximum margins).
        p_value: where the detector has one (MM-BD).
        seconds: time taken.
        extra: anything else worth recording (the reversed trigger's success rate, ...).
    """

    detector: str
    statistic: float
    threshold: float
    backdoored: bool
    suspect_class: int
    per_class: list[float]
    p_value: float | None = None
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
