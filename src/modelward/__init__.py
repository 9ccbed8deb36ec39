"""modelward: security and governance of trained deep-learning models."""

from modelward.errors import ConfigError, DataError, ModelwardError

__version__ = "0.1.0"
__all__ = ["ConfigError", "DataError", "ModelwardError", "__version__"]
