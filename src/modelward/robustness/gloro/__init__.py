"""GloRo certified-robust networks (seed 002 ch. 6–7, App. A–B): Lipschitz bounds by power iteration, the ⊥ logit,
GloRo / TRADES losses, ε and λ schedules, certification (VRA), RTK and affinity relaxations."""

from modelward.robustness.gloro.certify import (
    Certification,
    certified_mask,
    certified_radius,
    certify,
    empirical_lipschitz,
)
from modelward.robustness.gloro.layers import (
    ARCHITECTURES,
    InvertibleDownsampling,
    MinMax,
    Residual,
    build_gloro_model,
)
from modelward.robustness.gloro.lipschitz import (
    GloroError,
    LipschitzBound,
    UnknownLipschitzError,
    operator_norm,
)
from modelward.robustness.gloro.losses import gloro_cross_entropy, gloro_trades_loss
from modelward.robustness.gloro.net import AffinityGloroNet, FreezeReport, GloroNet, RtkGloroNet
from modelward.robustness.gloro.schedules import Schedule, decay_to

__all__ = [
    "ARCHITECTURES", "AffinityGloroNet", "Certification", "FreezeReport", "GloroError", "GloroNet",
    "InvertibleDownsampling", "LipschitzBound", "MinMax", "Residual", "RtkGloroNet", "Schedule",
    "UnknownLipschitzError", "build_gloro_model", "certified_mask", "certified_radius", "certify", "decay_to", "empirical_lipschitz",
    "gloro_cross_entropy", "gloro_trades_loss", "operator_norm",
]
