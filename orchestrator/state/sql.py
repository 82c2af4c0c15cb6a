"""What every aggregate of the state store shares: a connection that takes `?` placeholders, the
transactions a database lends, and the little that differs between SQLite and PostgreSQL.

Each aggregate (`episodes.py`, `groups.py`, `snapshots.py`, `events.py`, `nodes.py`,
`images.py`, `logs.py`, `requests.py`) writes its statements once, for both databases, over a
`Sql`: the database's write transaction, its reads, its group commit and its `Dialect`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from orchestrator.domain import Episode
from orchestrator.state import records


class Rows(Protocol):
    """What a statement returns: its rows, each readable by column name."""

    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    """A connection that runs one statement with `?` placeholders."""

    def execute(self, statement: str, args: Sequence[Any] = ..., /) -> Rows: ...


class SqlDatabase(Protocol):
    """A database as the trajectory ledger keeps its tables in it: the SQLite `Database` or the
    PostgreSQL store's `PostgresDatabase`, which both nest transactions and let a transaction
    read its own writes."""

    def tx(self) -> AbstractContextManager[Connection]:
        """One write transaction; inside this thread's own, a savepoint whose failure is undone
        alone."""

    def read(self) -> AbstractContextManager[Connection]:
        """A connection for reads; inside this thread's write transaction, that transaction's."""

    def close(self) -> None: ...


OpenConnection = Callable[[], AbstractContextManager[Connection]]
"""Lends a connection for a `with` block: a write transaction's, or one to read on."""
Grouped = Callable[[Callable[[Any], list[Episode]]], list[Episode]]
"""Runs work in a write transaction that concurrent callers share (`grouping.GroupCommit`)."""


class Dialect:
    """SQLite's way of saying what the aggregates' statements need; `PostgresDialect` says it
    the server's way."""

    queue_table = "episodes INDEXED BY episodes_queue"
    """The table the queue is read from. Without statistics (nothing runs ANALYZE), SQLite's
    planner picks the state index instead, and sorts the whole queue for each page: 20 ms a page
    at 50,000 waiting, against 1 ms."""

    def replace(self, table: str, columns: Sequence[str]) -> str:
        """Insert a row keyed by the first of `columns`, overwriting one of the same key."""
        return f"INSERT OR REPLACE INTO {table} ({', '.join(columns)}) VALUES ({_marks(columns)})"

    def insert_new(self, table: str, columns: Sequence[str]) -> str:
        """Insert a row unless one of its key is stored already."""
        return f"INSERT OR IGNORE INTO {table} ({', '.join(columns)}) VALUES ({_marks(columns)})"

    def one_of(self, column: str, values: Sequence[object]) -> tuple[str, list[object]]:
        """A condition that `column` is one of `values`, and its arguments."""
        return f"{column} IN ({_marks(values)})", list(values)

    def announce_events(self, db: Connection) -> None:
        """Called in every transaction that adds an event. SQLite's watchers wake on every
        commit anyway."""

    def episode(self, row: Any) -> Episode:
        """An episode from its row as the driver returns it."""
        return records.episode_from_row(dict(zip(row.keys(), row, strict=True)))  # quicker than row[name]


class PostgresDialect(Dialect):
    queue_table = "episodes"

    def __init__(self, events_channel: str) -> None:
        self._events_channel = events_channel

    def replace(self, table: str, columns: Sequence[str]) -> str:
        return (
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({_marks(columns)}) ON CONFLICT ({columns[0]})"
            f" DO UPDATE SET {', '.join(f'{c} = EXCLUDED.{c}' for c in columns[1:])}"
        )

    def insert_new(self, table: str, columns: Sequence[str]) -> str:
        return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({_marks(columns)}) ON CONFLICT DO NOTHING"

    def one_of(self, column: str, values: Sequence[object]) -> tuple[str, list[object]]:
        """One array argument, however many values: the statement's text stays the same."""
        return f"{column} = ANY(?)", [list(values)]

    def announce_events(self, db: Connection) -> None:
        db.execute(f"NOTIFY {self._events_channel}")  # sent on commit, once however many events

    def episode(self, row: Any) -> Episode:
        return records.episode_from_row(row)


def _marks(values: Sequence[object]) -> str:
    return ",".join("?" * len(values))


@dataclass(frozen=True)
class Sql:
    """One database as the aggregates use it."""

    tx: OpenConnection
    """One write transaction; inside it, reads see its own writes."""
    read: OpenConnection
    """A connection for reads, which see every committed transaction."""
    grouped: Grouped
    """Runs a submit's insert in a write transaction that concurrent submits share, each its own
    savepoint, and returns once it commits (group commit, `grouping.GroupCommit`)."""
    dialect: Dialect
