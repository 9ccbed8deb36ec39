"""The cost of the cryptographic alternatives to model splitting, measured side by side (issue 16, seed 000 §1).

Backends: ``plain`` PyTorch, ``split`` (the governance path: gRPC + mutual TLS party processes), ``he`` (TenSEAL
CKKS), ``mpc`` (MPyC, 3 party processes) and an optional ``crypten`` row. Entry point: :func:`run.run_cost`.
"""

from modelward.core.registry import lazy_exports

_EXPORTS = {"CostConfig": "modelward.cost.run:CostConfig", "run_cost": "modelward.cost.run:run_cost"}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
