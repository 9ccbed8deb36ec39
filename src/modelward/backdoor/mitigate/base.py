"""What a mitigation returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn


@dataclass
class Mitigation:
    """A repaired model and what the repair cost and achieved.

    Attributes:
        method: ``"fine_pruning"`` or ``"unlearning"``.
        model: the repaired model (a copy; the input model is not changed).
        before, after: :meth:`~modelward.backdoor.attacks.base.BackdoorEffect.to_dict` of the model before and
            after (clean accuracy and attack success rate on held-out data).
        details: what the method did (pruned channels, steps, the trigger used).
    """

    method: str
    model: nn.Module
    before: dict[str, Any]
    after: dict[str, Any]
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "before": self.before, "after": self.after, "details": self.details}
