"""Model-completion hardness (seed 000 §3): thresholds, retraining procedures T0 (reference) and T1–T4, resumable studies."""

from modelward.completion.metric import Thresholds, first_reach, hardness_ratio

__all__ = ["Thresholds", "first_reach", "hardness_ratio"]
