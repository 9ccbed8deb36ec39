"""Defenses against evasion attacks (seed 004 §2.3): distillation, feature squeezing, non-local-means denoising.

Adversarial training (Madry PGD, TRADES) lives in ``modelward.robustness.training``.
"""

from modelward.robustness.defenses.distillation import DistillationResult, defensive_distillation
from modelward.robustness.defenses.nlm import NonLocalMeans, TransformedModel
from modelward.robustness.defenses.squeeze import FeatureSqueezingDetector, median_filter, reduce_bit_depth

__all__ = ["DistillationResult", "FeatureSqueezingDetector", "NonLocalMeans", "TransformedModel",
           "defensive_distillation", "median_filter", "reduce_bit_depth"]
