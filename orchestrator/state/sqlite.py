"""The embedded state store: every aggregate in one SQLite file (WAL, synchronous=FULL).

Concurrent submits share one commit, and so one fsync (group commit, `grouping.GroupCommit`, as
on PostgreSQL). What is SQLite's own: watchers wake on every commit.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.state.database import Database
from orchestrator.state.lease import SoleLease
from orchestrator.state.schema import FORKS_INDEX, GROUP_MEMBERS_INDEX, KEYED_BY_INDEX, SCHEMA
from orchestrator.state.sql import Dialect, Sql
from orchestrator.state.store import SqlStateStore


class SqliteStateStore(SqlStateStore):
    """The embedded store: one SQLite file in WAL mode, fsync on every commit."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._database = Database(path, SCHEMA)
        super().__init__(
            Sql(self._database.tx, self._database.read, self._database.grouped, Dialect()),
            self._database.wait_for,
        )
        _migrate(self._database)

    @property
    def closed(self) -> bool:
        return self._database.closed

    def lease(self, holder: str) -> SoleLease:
        """The embedded file is this process's alone: it always leads."""
        return SoleLease(holder)

    def close(self) -> None:
        self._database.close()


def _migrate(database: Database) -> None:
    """Give a state file from an older orchestrator the columns it lacks."""
    db = database.db
    if "actor" not in {r["name"] for r in db.execute("PRAGMA table_info(events)")}:
        # a state directory from before events recorded who asked
        db.execute("ALTER TABLE events ADD COLUMN actor TEXT NOT NULL DEFAULT ''")
    if "disk_mb" not in {r["name"] for r in db.execute("PRAGMA table_info(nodes)")}:
        # a state directory from before nodes offered their disk
        db.execute("ALTER TABLE nodes ADD COLUMN disk_mb INTEGER NOT NULL DEFAULT 0")
    if "restores_forks" not in {r["name"] for r in db.execute("PRAGMA table_info(nodes)")}:
        # from before forks: its nodes restore none until they register again
        db.execute("ALTER TABLE nodes ADD COLUMN restores_forks INTEGER NOT NULL DEFAULT 0")
    if "manifest_digest" not in {r["name"] for r in db.execute("PRAGMA table_info(snapshots)")}:
        # from before manifests were digested: never restored
        db.execute("ALTER TABLE snapshots ADD COLUMN manifest_digest TEXT NOT NULL DEFAULT ''")
    if "group_id" not in {r["name"] for r in db.execute("PRAGMA table_info(episodes)")}:
        # from before GRPO groups: its episodes are in none
        db.execute("ALTER TABLE episodes ADD COLUMN group_id TEXT NOT NULL DEFAULT ''")
        db.execute("ALTER TABLE episodes ADD COLUMN group_index INTEGER NOT NULL DEFAULT 0")
    if "forked_from" not in {r["name"] for r in db.execute("PRAGMA table_info(episodes)")}:
        # from before forks: no episode is a fork child
        for column in ("forked_from TEXT", "fork_parent TEXT", "fork_index INTEGER", "key_of TEXT"):
            default = "0" if column.endswith("INTEGER") else "''"
            db.execute(f"ALTER TABLE episodes ADD COLUMN {column} NOT NULL DEFAULT {default}")
    db.execute(GROUP_MEMBERS_INDEX)
    db.execute(FORKS_INDEX)
    db.execute(KEYED_BY_INDEX)
