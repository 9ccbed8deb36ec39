"""Feature-wise bias amplification (seed 002 Ch. 9): the measure, Theorem 9.1, the Eq. 9.11 generator, learners and
the mitigations (feature parity, experts, ℓ1) and the study (``run_bias``). Names are imported lazily."""

from modelward.core.registry import lazy_exports

_EXPORTS = {name: f"modelward.bias.amplification:{name}" for name in (
    "bias_amplification", "theorem_9_1", "GaussianSetting", "LinearModel", "bayes_optimal", "asymmetric_gaussian",
    "asymmetry", "weak_weight_error", "mahalanobis_distance")}
_EXPORTS |= {name: f"modelward.bias.learners:{name}" for name in (
    "SGDSchedule", "fit_sgd", "fit_lbfgs_logistic", "fit_linear_svm", "fit_gaussian_nb", "fit_learner", "LEARNERS",
    "linear_head", "penultimate_features")}
_EXPORTS |= {name: f"modelward.bias.mitigation:{name}" for name in ("feature_parity", "experts")}
_EXPORTS |= {name: f"modelward.bias.study:{name}" for name in ("BiasConfig", "BiasOutcome", "run_bias")}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
