"""How much work each profile does: `quick` (minutes on a laptop CPU), `standard`, `thorough`.

The quick profile also has a compute budget per section (``budget_tflop``, in forward+backward FLOPs counted on the
model itself): a section whose planned work would exceed it on a large model (a ResNet-18 on 32×32 images costs
~0.22 GFLOP per point-gradient, a digits CNN 0.0006) evaluates fewer points, down to stated floors, and says so in
the report (:func:`modelward.assess.sections.common.fit_budget`). The count is deterministic (the same model and
data give the same points on every machine); counts set in ``[sizes]`` are never reduced. The other profiles have no
budget: they announce their estimate and run it all.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from modelward.assess.config import AssessConfig, Profile
from modelward.errors import ConfigError


@dataclass(frozen=True)
class ProfileSizes:
    """Sizes of every section's work; the report states the profile used."""

    n_eval: int  # test points attacked / certified
    linf_eps: tuple[float, ...]  # for images in [0, 1] (tabular: in units of each feature's standard deviation)
    l2_eps: tuple[float, ...]
    reference_l2: float  # the ℓ2 ε of the robustness verdict (images in [0, 1]: 0.5, as RobustBench)
    pgd_steps: int
    cw_points: int
    cw_steps: int
    shadows: int  # LiRA offline shadow models
    shadow_steps: int | None  # None: the recipe's steps
    mia_points: int  # members and as many non-members scored
    query_budget: int  # extraction queries
    substitute_epochs: int
    completion_seeds: int
    completion_steps: int | None  # None: the recipe's steps
    inversion_steps: int
    explain_points: int
    reference_linf: float = 8 / 255  # the L∞ ε of the robustness verdict (images in [0, 1], as RobustBench)
    budget_tflop: float | None = None  # forward+backward TFLOP per section; larger work is cut to fit (quick only)


PROFILES: dict[Profile, ProfileSizes] = {
    "quick": ProfileSizes(n_eval=200, linf_eps=(2 / 255, 8 / 255, 16 / 255), l2_eps=(0.25, 0.5, 1.0), reference_l2=0.5,
                          pgd_steps=10, cw_points=50, cw_steps=100, shadows=4, shadow_steps=None, mia_points=300,
                          query_budget=400, substitute_epochs=8, completion_seeds=1, completion_steps=200,
                          inversion_steps=60, explain_points=100, budget_tflop=1.0),
    "standard": ProfileSizes(n_eval=500, linf_eps=(2 / 255, 4 / 255, 8 / 255, 16 / 255, 0.1),
                             l2_eps=(0.25, 0.5, 1.0, 1.5),
                             reference_l2=0.5, pgd_steps=40, cw_points=200, cw_steps=100, shadows=16,
                             shadow_steps=None, mia_points=1000, query_budget=1500, substitute_epochs=20,
                             completion_seeds=2, completion_steps=None, inversion_steps=200, explain_points=300),
    "thorough": ProfileSizes(n_eval=2000, linf_eps=(1 / 255, 2 / 255, 4 / 255, 8 / 255, 16 / 255, 0.1, 0.2),
                             l2_eps=(0.1, 0.25, 0.5, 1.0, 1.5, 2.0), reference_l2=0.5, pgd_steps=100, cw_points=500,
                             cw_steps=300, shadows=64, shadow_steps=None, mia_points=5000, query_budget=5000,
                             substitute_epochs=30, completion_seeds=3, completion_steps=None, inversion_steps=500,
                             explain_points=1000),
}


#: the sizes ``[sizes]`` may override (counts: points, steps, models)
COUNT_FIELDS = tuple(f.name for f in fields(ProfileSizes) if f.type in ("int", "int | None"))
#: per section, the counts a budget may reduce and the least each keeps (a stated floor: the report's intervals say
#: what so few points can tell)
BUDGET_FLOORS: dict[str, dict[str, int]] = {
    "robustness": {"n_eval": 30, "cw_points": 10, "cw_steps": 25},
    "privacy": {"mia_points": 50, "shadows": 2},
    "extraction": {"query_budget": 100, "substitute_epochs": 3},
    "explanations": {"explain_points": 20},
}


def profile_sizes(cfg: AssessConfig) -> ProfileSizes:
    """The profile's sizes with the config's ``[sizes]`` overrides (e.g. ``n_eval = 100`` for fewer points).

    Raises:
        ConfigError: an override that is not a count of :class:`ProfileSizes` (the message lists the valid ones).

    Example:
        >>> profile_sizes(AssessConfig(checkpoint="m.safetensors", sizes={"n_eval": 50})).n_eval
        50
    """
    bad = sorted(set(cfg.sizes) - set(COUNT_FIELDS))
    if bad:
        raise ConfigError(f"sizes: unknown field(s) {bad}; valid: {list(COUNT_FIELDS)}")
    return replace(PROFILES[cfg.profile], **cfg.sizes)
