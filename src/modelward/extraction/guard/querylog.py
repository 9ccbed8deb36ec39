"""The guard's query log (kept for imports from before the store package): :class:`QueryLog` is the embedded
SQLite store, :class:`~modelward.extraction.guard.store.sqlite.SQLiteStore`; see :mod:`modelward.extraction.guard.store`."""

from __future__ import annotations

from modelward.extraction.guard.store import StoredKey, Transaction, key_digest
from modelward.extraction.guard.store.sqlite import SQLiteStore as QueryLog

__all__ = ["QueryLog", "StoredKey", "Transaction", "key_digest"]
