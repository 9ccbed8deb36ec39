"""One security report per model: every threat area in one command (``modelward assess``).

Example:
    >>> from modelward.assess import AssessConfig, run_assessment
    >>> cfg = AssessConfig(checkpoint="model.safetensors", profile="quick")  # doctest: +SKIP
    >>> run_assessment(cfg, "assess-out")  # writes assess-out/report.html and report.json  # doctest: +SKIP
"""

from modelward.assess.config import AssessConfig, SplitConfig
from modelward.assess.report import write_report
from modelward.assess.run import run_assessment

__all__ = ["AssessConfig", "SplitConfig", "run_assessment", "write_report"]
