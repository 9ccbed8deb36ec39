"""Error types. Every error a user can cause is a ModelwardError with an actionable message."""

from __future__ import annotations


class ModelwardError(Exception):
    """Base class of all errors a user can act on; the CLI prints these without a traceback."""


class ConfigError(ModelwardError, ValueError):
    """A configuration file or override is malformed; the message names the field and the valid choices.

    Also a ``ValueError``, so code catching bad arguments the standard way catches it too.
    """


class DataError(ModelwardError, ValueError):
    """A data file is missing or malformed; the message names the file and what is wrong (also a ValueError)."""


class PartError(ModelwardError):
    """A model part name does not resolve; the message lists the valid names."""


class LedgerError(ModelwardError):
    """The run ledger is inconsistent with the requested study (e.g. a different config in the same folder)."""


class IdentityError(ModelwardError):
    """A peer's certificate matches no pinned identity; the message names the presented fingerprint."""


class UntrustedCodeError(ConfigError):
    """A config names Python code (an entry point) and the operator did not say they trust it (``--trust-code``,
    ``MODELWARD_TRUST_CODE=1`` or ``modelward trust allow CONFIG``); the message names the entry point and them."""
