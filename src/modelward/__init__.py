"""modelward: security and governance of trained deep-learning models.

Each threat area is a subpackage, imported on first use (``import modelward`` stays fast)::

    import modelward
    modelward.robustness.PGD            # evasion attacks, adversarial training, GloRo certification
    modelward.extraction.ModelGuardS    # extraction defenses and attacks, the guarded prediction API
    modelward.completion.run_study      # model-completion hardness
    modelward.governance.make_plan      # split training between parties, consent, audit
    modelward.backdoor.NeuralCleanse    # backdoors: attacks, detection in model / data / at the API, repair
    modelward.privacy, modelward.explain, modelward.bias, modelward.cost, modelward.assess

See docs/api.md for each area's main job in a few lines of Python.
"""

import importlib
from typing import Any

from modelward.errors import ConfigError, DataError, ModelwardError

__version__ = "0.1.0"
AREAS = ("assess", "backdoor", "bias", "completion", "core", "cost", "explain", "extraction", "governance", "privacy",
         "rl", "robustness")
__all__ = ["ConfigError", "DataError", "ModelwardError", "__version__", *AREAS]


def __getattr__(name: str) -> Any:
    if name in AREAS:
        return importlib.import_module(f"{__name__}.{name}")  # the import binds it as an attribute of the package
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(AREAS))
