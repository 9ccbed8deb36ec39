"""One security report per model: every threat area in one command (``modelward assess``).

Example:
    >>> from modelward.assess import AssessConfig, run_assessment
    >>> cfg = AssessConfig(checkpoint="model.safetensors", profile="quick")  # doctest: +SKIP
    >>> run_assessment(cfg, "assess-out")  # writes assess-out/report.html and report.json  # doctest: +SKIP
"""

from modelward.core.registry import lazy_exports

_EXPORTS = {"AssessConfig": "modelward.assess.config:AssessConfig", "SplitConfig": "modelward.assess.config:SplitConfig",
            "write_report": "modelward.assess.report:write_report", "run_assessment": "modelward.assess.run:run_assessment"}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
