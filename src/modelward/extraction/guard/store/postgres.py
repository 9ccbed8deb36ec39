"""The guard's store in PostgreSQL: several ``guard serve`` replicas behind a load balancer share one state —
budgets, the query log, operator keys, ModelGuard-S centroids, watermark marks and the detector's state.

How replicas stay exact: every request is one transaction (READ COMMITTED). The budget is charged with one
conditional ``UPDATE`` (a concurrent update of the same key's row waits for the first to commit and re-checks the
condition on the committed value: a key is never charged beyond its budget, and nothing is answered that was not
charged). The centroid table is locked (``LOCK TABLE ... IN EXCLUSIVE MODE``) for the transaction and the
centroids other replicas added are read first, so ModelGuard-S keeps one global insertion order, as on one server.
The detector's row of the key is locked (``SELECT ... FOR UPDATE``) and read again when another replica changed it
(a version number). Lock order is always usage → centroids → detector, so two requests never deadlock.
``kill -9`` of a replica loses nothing that was answered: its open transaction is rolled back by the server.

Needs ``psycopg`` 3 (``pip install 'modelward[postgres]'``). The URL is libpq's (``postgresql://user@host:5432/db``;
a password is best given by ``PGPASSWORD`` or ``~/.pgpass``, not in the config).
"""

from __future__ import annotations

from typing import Any

from modelward.errors import ConfigError
from modelward.extraction.guard.errors import WouldBlock
from modelward.extraction.guard.store.base import SQLStore, Transaction

try:  # optional dependency: the SQLite default needs nothing
    import psycopg
    from psycopg import errors as pg_errors
except ImportError:  # pragma: no cover - exercised where psycopg is missing
    psycopg = None  # type: ignore[assignment]
    pg_errors = None  # type: ignore[assignment]


class PostgresDialect:
    name = "postgresql"
    types = {"blob": "BYTEA", "real": "DOUBLE PRECISION", "int": "BIGINT", "serial_pk": "BIGSERIAL PRIMARY KEY"}
    row_locks = True  # replicas write concurrently: lock what a request reads before it writes

    def sql(self, stmt: str) -> str:
        # the statements are written with SQLite's "?" placeholders; none has a literal "?" or "%"
        return stmt.replace("%", "%%").replace("?", "%s")

    def begin(self, db: Any, wait: bool) -> None:
        if not wait:
            raise WouldBlock  # every call is a network round trip, and may wait for another replica's lock
        db.execute("BEGIN")

    def is_busy(self, e: BaseException) -> bool:
        return pg_errors is not None and isinstance(e, pg_errors.LockNotAvailable | pg_errors.QueryCanceled)

    def blob(self, b: bytes) -> Any:
        return b

    def tables(self, txn: Transaction) -> set[str]:
        return {r[0] for r in txn.execute("SELECT table_name FROM information_schema.tables "
                                          "WHERE table_schema = current_schema()").fetchall()}

    def columns(self, txn: Transaction, table: str) -> set[str]:
        return {r[0] for r in txn.execute("SELECT column_name FROM information_schema.columns "
                                          "WHERE table_schema = current_schema() AND table_name = ?",
                                          (table,)).fetchall()}

    def migration_lock(self, txn: Transaction) -> None:
        txn.execute("SELECT pg_advisory_xact_lock(7347112390214)")  # replicas starting together migrate once

    def set_busy_timeout(self, db: Any, seconds: float) -> None:
        db.execute(f"SET lock_timeout = '{int(seconds * 1000)}ms'")


class PostgresStore(SQLStore):
    """The guard's store in a PostgreSQL database shared by replicas (see :class:`~.base.SQLStore` for the
    arguments and the module docstring for how budgets stay exact).

    Args:
        url: a libpq connection URL or string.

    Example:
        >>> store = PostgresStore("postgresql://guard@db:5432/guard", retention_days=90)  # doctest: +SKIP
    """

    shared = True

    def __init__(self, url: str, busy_timeout: float = 5.0, retention_days: float | None = None,
                 max_rows: int | None = None, detector_window: int = 1000) -> None:
        if psycopg is None:
            raise ConfigError("server.store_url: a PostgreSQL store needs psycopg 3: pip install 'modelward[postgres]'")
        self.url, self.where = url, _redact(url)
        self.dialect = PostgresDialect()
        try:
            self.db = psycopg.connect(url, autocommit=True, connect_timeout=10)
        except psycopg.Error as e:
            raise ConfigError(f"server.store_url: cannot connect to {self.where}: {str(e).strip()}") from None
        self.dialect.set_busy_timeout(self.db, busy_timeout)
        self._setup(busy_timeout, retention_days, max_rows, detector_window)

    def _executemany(self, stmt: str, rows: list[Any]) -> None:
        with self.db.cursor() as cur:
            cur.executemany(stmt, rows)


def _redact(url: str) -> str:
    """The URL without its password (for messages)."""
    if "://" in url and "@" in url:
        scheme, rest = url.split("://", 1)
        cred, host = rest.rsplit("@", 1)
        return f"{scheme}://{cred.split(':', 1)[0]}@{host}"
    return url
