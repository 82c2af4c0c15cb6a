"""The snapshots recorded of episodes, and what retention must keep of them. A snapshot commits
with the change of its episode that makes it the resume point, and with its event."""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any, Protocol

from orchestrator.domain import Episode, SnapshotRecord
from orchestrator.state import episode_rows, events, records
from orchestrator.state.sql import Connection, Sql

COLUMNS = (
    "id", "episode_id", "sequence", "parent_id", "node", "reason", "created_at", "logical_bytes", "stored_bytes",
    "new_bytes", "trajectory_cursor", "timings_ms", "manifest_digest",
)  # fmt: skip
"""The columns of `snapshots`, in the order of `records.snapshot_row`."""


class Snapshots(Protocol):
    def add(self, snapshot: SnapshotRecord, **changes: Any) -> Episode:
        """Record a snapshot that needs no state change (an autosave): it becomes its episode's
        resume point, with `changes` to the episode, and an event says so."""

    def of(self, episode_id: str) -> list[SnapshotRecord]:
        """The episode's snapshots, oldest first."""

    def get(self, snapshot_id: str) -> SnapshotRecord | None:
        """The snapshot recorded under that id, of whichever episode; None if none is."""

    def forks(self, snapshot_ids: Collection[str]) -> dict[str, list[str]]:
        """The episodes forked from each of `snapshot_ids` that has any, in fork index order."""

    def anchors(self) -> tuple[dict[str, str], list[str]]:
        """What snapshot retention must keep of live episodes: each one's resume point (its
        last recorded snapshot) by episode id, and the snapshots being taken."""


def insert(sql: Sql, db: Connection, snapshot: SnapshotRecord) -> None:
    """Store `snapshot` in the write transaction `db`, unless its id is stored already."""
    db.execute(sql.dialect.insert_new("snapshots", COLUMNS), records.snapshot_row(snapshot))


class SqlSnapshots:
    def __init__(self, sql: Sql) -> None:
        self._sql = sql

    def add(self, snapshot: SnapshotRecord, **changes: Any) -> Episode:
        with self._sql.tx() as db:
            current = episode_rows.fetch(self._sql, db, snapshot.episode_id)
            insert(self._sql, db, snapshot)
            episode_rows.apply(
                db,
                snapshot.episode_id,
                {
                    "snapshots": current.snapshots + 1,
                    "last_snapshot_id": snapshot.id,
                    "updated_at": time.time(),
                    **changes,
                },
            )
            events.record(
                self._sql, db, snapshot.episode_id, "decision", current.state, current.state,
                f"{snapshot.reason} snapshot {snapshot.id} stored", snapshot.node, "",
            )  # fmt: skip
            return episode_rows.fetch(self._sql, db, snapshot.episode_id)

    def of(self, episode_id: str) -> list[SnapshotRecord]:
        with self._sql.read() as db:
            rows = db.execute(
                "SELECT * FROM snapshots WHERE episode_id = ? ORDER BY sequence", (episode_id,)
            ).fetchall()
        return [records.snapshot_from_row(r) for r in rows]

    def get(self, snapshot_id: str) -> SnapshotRecord | None:
        with self._sql.read() as db:
            row = db.execute("SELECT * FROM snapshots WHERE id = ?", (snapshot_id,)).fetchone()
        return records.snapshot_from_row(row) if row is not None else None

    def forks(self, snapshot_ids: Collection[str]) -> dict[str, list[str]]:
        if not snapshot_ids:
            return {}
        found: dict[str, list[str]] = {}
        with self._sql.read() as db:
            rows = db.execute(
                f"SELECT id, forked_from FROM episodes WHERE forked_from IN ({','.join('?' * len(snapshot_ids))})"
                " ORDER BY fork_index, submitted_at, id",
                tuple(snapshot_ids),
            ).fetchall()
        for r in rows:
            found.setdefault(r["forked_from"], []).append(r["id"])
        return found

    def anchors(self) -> tuple[dict[str, str], list[str]]:
        with self._sql.read() as db:
            rows = db.execute(
                "SELECT id, last_snapshot_id, pending_snapshot_id FROM episodes"
                " WHERE finished_at = 0 AND (last_snapshot_id != '' OR pending_snapshot_id != '')"
            ).fetchall()
        resume = {r["id"]: r["last_snapshot_id"] for r in rows if r["last_snapshot_id"]}
        return resume, [r["pending_snapshot_id"] for r in rows if r["pending_snapshot_id"]]
