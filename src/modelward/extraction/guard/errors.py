"""What the guard refuses, transport-free: each error carries a machine-readable ``code``; the HTTP layer
(:mod:`modelward.extraction.guard.http`) maps codes to status codes."""

from __future__ import annotations

from modelward.errors import ModelwardError


class GuardError(ModelwardError):
    """A request the guard refuses (``code``: e.g. ``bad_shape``, ``unauthenticated``); nothing was charged.

    Args:
        code: machine-readable reason, echoed to the client as ``{"code": ...}``.
        message: what was wrong and what is expected.
    """

    def __init__(self, code: str, message: str, rows: int = 0) -> None:
        super().__init__(message)
        self.code, self.message, self.rows = code, message, rows


class BudgetExceeded(GuardError):
    """The key's query budget cannot pay for the request's rows (nothing was charged)."""

    def __init__(self, key_name: str, used: int, budget: int, rows: int) -> None:
        super().__init__("query_budget_exceeded", f"query budget of key {key_name!r} exhausted: {used} of {budget} "
                         f"used, {rows} requested", rows)
        self.key_name, self.used, self.budget, self.rows = key_name, used, budget, rows


class WouldBlock(Exception):  # noqa: N818 - a signal, not an error
    """Raised instead of waiting (``wait=False``) when the model or the query log is busy; nothing was changed."""
