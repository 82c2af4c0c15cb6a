"""The server state store: the embedded store's tables and semantics in a PostgreSQL database,
for an orchestrator whose state should live on a database server rather than its own disk.

It behaves as `SqliteStateStore` does, method for method: both compose the same aggregates.
Every state change commits together with its event in one transaction, and writers take one
lock first (`WRITER_LOCK`), so they see each other's work as SQLite's single writer does and
events commit in `seq` order. A request id is looked up and stored in the transaction of the
work it names. Concurrent submits share one commit, and so one flush of the server's WAL
(group commit, `grouping.GroupCommit`, as on SQLite). Watchers wake on NOTIFY. What differs: the
server must be reachable, else calls fail with TemporaryError.
"""

from __future__ import annotations

from orchestrator.state.postgres_database import EVENTS_CHANNEL, PostgresDatabase, PostgresLease
from orchestrator.state.postgres_schema import ADDED_INDEXES, SCHEMA
from orchestrator.state.sql import PostgresDialect, Sql
from orchestrator.state.store import SqlStateStore


class PostgresStateStore(SqlStateStore):
    """The server store: one PostgreSQL database, reached through a pool of connections."""

    def __init__(self, url: str) -> None:
        self._database = PostgresDatabase(url, SCHEMA, ADDED_INDEXES)
        super().__init__(
            Sql(
                self._database.tx,
                self._database.read,
                self._database.grouped,
                PostgresDialect(EVENTS_CHANNEL),
            ),
            self._database.wait_for,
        )
        self.where = self._database.where
        """The database's URL without its password."""
        self._lease: PostgresLease | None = None

    @property
    def database(self) -> PostgresDatabase:
        """The store's database, which the trajectory ledger shares (its pool, its writer lock)."""
        return self._database

    @property
    def closed(self) -> bool:
        return self._database.closed

    def lease(self, holder: str) -> PostgresLease:
        """Leadership among the orchestrators on this database; from now on, this store writes
        only while `holder` leads. Closing the store gives it up."""
        self._lease = PostgresLease(self._database, holder)
        return self._lease

    def close(self) -> None:
        if self._lease is not None:
            self._lease.release()
        self._database.close()
