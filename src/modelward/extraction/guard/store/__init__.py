"""The guard's store behind one interface (:class:`Store`): the embedded SQLite default and PostgreSQL for
replicas that share one state. :func:`open_store` picks one from the config."""

from __future__ import annotations

from pathlib import Path

from modelward.extraction.guard.store.base import (
    SQLStore,
    Store,
    StoreBusy,
    StoredKey,
    Transaction,
    key_digest,
)
from modelward.extraction.guard.store.sqlite import SQLiteStore

__all__ = ["SQLStore", "SQLiteStore", "Store", "StoreBusy", "StoredKey", "Transaction", "key_digest", "open_store"]


def open_store(url: str | None, path: Path, busy_timeout: float = 5.0, retention_days: float | None = None,
               max_rows: int | None = None, detector_window: int = 1000) -> SQLStore:
    """The store ``url`` names (``postgresql://…``), or the SQLite file ``path`` when ``url`` is None.

    Args:
        url: a PostgreSQL URL (``server.store_url``), or None for the embedded SQLite store.
        path: the SQLite file (``state_dir / server.query_log``).
        busy_timeout, retention_days, max_rows, detector_window: see :class:`SQLStore`.

    Returns:
        An open store (schema migrated).

    Example:
        >>> store = open_store(None, Path("guard_state/queries.sqlite"))  # doctest: +SKIP
    """
    if url:
        # lazy: psycopg is an optional dependency, imported only when a PostgreSQL store is configured
        from modelward.extraction.guard.store.postgres import PostgresStore

        return PostgresStore(url, busy_timeout, retention_days, max_rows, detector_window)
    return SQLiteStore(path, busy_timeout, retention_days, max_rows, detector_window)
