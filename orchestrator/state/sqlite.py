"""The embedded state store: episodes, their events, snapshots, nodes and request ids in one
SQLite file (WAL, synchronous=FULL), by the logic of `sql.py`.

Concurrent submits share one commit, and so one fsync (group commit, `grouping.GroupCommit`, as
on PostgreSQL). What is SQLite's own: watchers wake on every commit.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from orchestrator.domain import Episode
from orchestrator.state import records
from orchestrator.state.database import Database
from orchestrator.state.lease import SoleLease
from orchestrator.state.schema import GROUP_MEMBERS_INDEX, SCHEMA
from orchestrator.state.sql import SqlStateStore


class SqliteStateStore(SqlStateStore):
    """The embedded store: one SQLite file in WAL mode, fsync on every commit."""

    INSERT_SNAPSHOT = "INSERT OR IGNORE INTO snapshots VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"
    REPLACE_NODE = "INSERT OR REPLACE INTO nodes VALUES (?,?,?,?,?,?,?,?,?,?)"
    REPLACE_IMAGE = "INSERT OR REPLACE INTO images VALUES (?,?,?,?,?,?)"
    REPLACE_LOG = "INSERT OR REPLACE INTO logs VALUES (?,?,?)"
    # Without statistics (nothing runs ANALYZE), SQLite's planner picks the state index instead,
    # and sorts the whole queue for each page: 20 ms a page at 50,000 waiting, against 1 ms.
    QUEUE_TABLE = "episodes INDEXED BY episodes_queue"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._database = Database(path, SCHEMA, on_commit=lambda: self._changed.notify_all())
        super().__init__(self._database.tx, self._database.read, self._database.grouped)
        self._db = self._database.db
        self._changed = threading.Condition(self._database.lock)
        columns = {r["name"] for r in self._db.execute("PRAGMA table_info(events)")}
        if "actor" not in columns:  # a state directory from before events recorded who asked
            self._db.execute("ALTER TABLE events ADD COLUMN actor TEXT NOT NULL DEFAULT ''")
        if "disk_mb" not in {r["name"] for r in self._db.execute("PRAGMA table_info(nodes)")}:
            # a state directory from before nodes offered their disk
            self._db.execute("ALTER TABLE nodes ADD COLUMN disk_mb INTEGER NOT NULL DEFAULT 0")
        columns = {r["name"] for r in self._db.execute("PRAGMA table_info(snapshots)")}
        if "manifest_digest" not in columns:  # from before manifests were digested: never restored
            self._db.execute("ALTER TABLE snapshots ADD COLUMN manifest_digest TEXT NOT NULL DEFAULT ''")
        if "group_id" not in {r["name"] for r in self._db.execute("PRAGMA table_info(episodes)")}:
            # from before GRPO groups: its episodes are in none
            self._db.execute("ALTER TABLE episodes ADD COLUMN group_id TEXT NOT NULL DEFAULT ''")
            self._db.execute("ALTER TABLE episodes ADD COLUMN group_index INTEGER NOT NULL DEFAULT 0")
        self._db.execute(GROUP_MEMBERS_INDEX)

    @property
    def closed(self) -> bool:
        return self._database.closed

    def lease(self, holder: str) -> SoleLease:
        """The embedded file is this process's alone: it always leads."""
        return SoleLease(holder)

    def close(self) -> None:
        self._database.close()
        with self._changed:
            self._changed.notify_all()

    def _episode_from_row(self, row: sqlite3.Row) -> Episode:
        return records.episode_from_row(dict(zip(row.keys(), row, strict=True)))  # quicker than row[name]

    def wait_for_events(self, since_seq: int, timeout: float) -> bool:
        """Block until an event newer than since_seq exists, the store closes, or timeout passes."""
        with self._changed:
            return self._changed.wait_for(
                lambda: (
                    self.closed
                    or (self._db.execute("SELECT MAX(seq) FROM events").fetchone()[0] or 0) > since_seq
                ),
                timeout=timeout,
            )
