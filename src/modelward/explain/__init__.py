"""Explanations by internal influence (seed 002 Ch. 3–4): slices, quantities and distributions of interest, the
special cases of §3.4, the interpretation helpers of §3.3 and the study (``run_explain``). Names are imported lazily."""

from modelward.core.registry import lazy_exports

_EXPORTS = {name: f"modelward.explain.influence:{name}" for name in (
    "InternalInfluence", "Slice", "QuantityOfInterest", "ClassQoI", "ComparativeQoI", "MaxClassQoI", "UnitQoI",
    "ChannelQoI", "LambdaQoI", "DistributionOfInterest", "PointDoI", "LinearDoI", "GaussianDoI", "DatasetDoI",
    "MixtureDoI", "completeness_gap")}
_EXPORTS |= {name: f"modelward.explain.methods:{name}" for name in (
    "saliency", "gradient_x_input", "smoothgrad", "integrated_gradients", "METHODS")}
_EXPORTS |= {name: f"modelward.explain.interpret:{name}" for name in (
    "top_units", "unit_attribution", "unit_inversion", "compare_models", "attribute")}
_EXPORTS |= {name: f"modelward.explain.study:{name}" for name in ("ExplainConfig", "ExplainOutcome", "run_explain")}
_EXPORTS["feature_layer"] = "modelward.explain.layers:feature_layer"
_EXPORTS |= {"token_attributions": "modelward.explain.text:token_attributions"}  # text models (issue 39)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
