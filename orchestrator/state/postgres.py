"""The server state store: the embedded store's tables and semantics in a PostgreSQL database,
for an orchestrator whose state should live on a database server rather than its own disk.

It behaves as `SqliteStateStore` does, method for method: both run the logic of `sql.py`.
Every state change commits together with its event in one transaction, and writers take one
lock first (`WRITER_LOCK`), so they see each other's work as SQLite's single writer does and
events commit in `seq` order. A request id is looked up and stored in the transaction of the
work it names. Concurrent submits share one commit, and so one flush of the server's WAL
(group commit, `grouping.GroupCommit`, as on SQLite). Watchers wake on NOTIFY. What differs: the
server must be reachable, else calls fail with TemporaryError.
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.state.postgres_database import EVENTS_CHANNEL, PostgresDatabase, PostgresLease
from orchestrator.state.postgres_schema import ADDED_INDEXES, SCHEMA
from orchestrator.state.sql import Connection, SqlStateStore


def _replace(table: str, columns: Sequence[str]) -> str:
    """SQLite's INSERT OR REPLACE: a row keyed by the first column, new or overwriting."""
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(['?'] * len(columns))})"
        f" ON CONFLICT ({columns[0]}) DO UPDATE SET {', '.join(f'{c} = EXCLUDED.{c}' for c in columns[1:])}"
    )


class PostgresStateStore(SqlStateStore):
    """The server store: one PostgreSQL database, reached through a pool of connections."""

    INSERT_SNAPSHOT = "INSERT INTO snapshots VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING"
    REPLACE_NODE = _replace(
        "nodes",
        (
            "name",
            "address",
            "state",
            "backend",
            "slots",
            "memory_mb",
            "images",
            "labels",
            "registered_at",
            "disk_mb",
        ),
    )
    REPLACE_IMAGE = _replace("images", ("name", "reference", "digest", "size_bytes", "source", "created_at"))
    REPLACE_LOG = _replace("logs", ("episode_id", "start", "content"))

    def __init__(self, url: str) -> None:
        self._database = PostgresDatabase(url, SCHEMA, ADDED_INDEXES)
        super().__init__(self._database.tx, self._database.read, self._database.grouped)
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

    def _one_of(self, column: str, values: Sequence[object]) -> tuple[str, list[object]]:
        """One array argument, however many values: the statement's text stays the same."""
        return f"{column} = ANY(?)", [list(values)]

    def _announce_events(self, db: Connection) -> None:
        db.execute(f"NOTIFY {EVENTS_CHANNEL}")  # sent on commit, once however many events

    def wait_for_events(self, since_seq: int, timeout: float) -> bool:
        """Block until an event newer than since_seq exists, the store closes, or timeout passes."""
        return self._database.wait_for(lambda: self._last_seq() > since_seq, timeout)

    def _last_seq(self) -> int:
        with self._read() as db:
            row = db.execute("SELECT COALESCE(MAX(seq), 0) AS seq FROM events").fetchone()
        return int(row["seq"]) if row else 0
