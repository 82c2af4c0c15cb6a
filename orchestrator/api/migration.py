"""Moving an orchestrator's state from its SQLite file to PostgreSQL (`stasis state migrate`).

Everything in the state dir's `state.db` is copied: episodes, their groups, their events (with
their `seq`), snapshots, nodes, images, logs, request ids and the trajectory ledger's turns,
verifications, published policy versions and upstream failures.
The copy is one PostgreSQL transaction into a database that holds none of these rows yet, so it
lands whole or not at all, and it never mixes with another orchestrator's state. The SQLite file's
rows are only read (an older file gets the columns and tables a current orchestrator adds at
start). It refuses to run while an orchestrator uses the state dir, and no orchestrator starts
on it until the copy is done (`StateDirLock`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

from orchestrator.domain import FailedPrecondition
from orchestrator.state import PostgresStateStore, SqliteStateStore, StateDirLock
from orchestrator.trajectory import Ledger

TABLES = (
    "episodes", "episode_groups", "events", "snapshots", "nodes", "images", "logs", "requests", "turns",
    "verifications", "policy_versions", "upstream_failures", "fork_origins",
)  # fmt: skip
"""Every table the two databases share, the ledger's last."""
IDENTITIES = {"events": "seq", "turns": "id"}
"""Columns the database numbers; the copy keeps their values, and new rows follow the largest."""


def migrate_to_postgres(state_db: Path, url: str) -> dict[str, int]:
    """Copy every row of `state_db` into the PostgreSQL database at `url`; rows copied per table.

    FailedPrecondition, with nothing written, if there is no state file, if an orchestrator runs
    on it, if the database already holds any of the rows, or if a text holds a NUL, which
    PostgreSQL's text cannot."""
    if not state_db.is_file():
        raise FailedPrecondition(f"there is no state file {state_db} to migrate")
    owner = StateDirLock(state_db.parent, "stasis state migrate")
    try:
        return _copy(state_db, url)
    finally:
        owner.release()


def _copy(state_db: Path, url: str) -> dict[str, int]:
    # Opened once as the orchestrator would: an older file gets the columns and tables it lacks.
    SqliteStateStore(state_db).close()
    Ledger.sqlite(state_db).close()
    source = sqlite3.connect(f"file:{state_db}?mode=ro", uri=True)
    target = PostgresStateStore(url)
    try:
        Ledger.postgres(target.database)
        copied = {}
        with target.database.tx() as db:
            held = [t for t in TABLES if db.execute(f"SELECT 1 FROM {t} LIMIT 1").fetchone() is not None]
            if held:
                raise FailedPrecondition(
                    f"the database {target.where} already holds {', '.join(held)}; "
                    "migrate into a database no orchestrator has used"
                )
            source.execute("BEGIN")  # one consistent view of the file
            for table in TABLES:
                columns = [row[1] for row in source.execute(f"PRAGMA table_info({table})")]
                rows = source.execute(f"SELECT {', '.join(columns)} FROM {table}")
                copied[table] = db.copy(table, columns, _checked(table, columns, rows))
            for table, column in IDENTITIES.items():
                db.execute(
                    f"SELECT setval(pg_get_serial_sequence('{table}', '{column}'), "
                    f"COALESCE(MAX({column}), 0) + 1, false) FROM {table}"
                )
        return copied
    finally:
        source.close()
        target.close()


def _checked(table: str, columns: list[str], rows: sqlite3.Cursor) -> Iterator[tuple[object, ...]]:
    for row in rows:
        for column, value in zip(columns, row, strict=True):
            if isinstance(value, str) and "\0" in value:
                raise FailedPrecondition(
                    f"{table}.{column} of the row {columns[0]}={row[0]!r} holds a NUL character, "
                    "which PostgreSQL's text cannot; nothing was migrated"
                )
        yield row
