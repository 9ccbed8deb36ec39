"""The driver of a split: its configuration (:mod:`.config`), how it reaches the parties (:mod:`.connect`), the
coordinator of the two-phase commit (:mod:`.coordinator`, with :mod:`.chain`), evaluations and predictions
(:mod:`.queries`) and the resumable training loop with ``split train`` (:mod:`.training`).

Example:
    >>> from modelward.governance.driver import SplitDriver, load_split_config  # doctest: +SKIP
    >>> with SplitDriver(load_split_config("split.toml")) as drv:  # doctest: +SKIP
    ...     drv.train()
"""

from modelward.governance.driver.config import PartyRef, SplitConfig, load_split_config
from modelward.governance.driver.connect import Connect, grpc_connect, hosted_connect
from modelward.governance.driver.coordinator import Coordinator
from modelward.governance.driver.queries import OutputsKept
from modelward.governance.driver.training import SplitDriver, SplitTrainResult, run_training

__all__ = ["Connect", "Coordinator", "OutputsKept", "PartyRef", "SplitConfig", "SplitDriver", "SplitTrainResult", "grpc_connect",
           "hosted_connect", "load_split_config", "run_training"]
