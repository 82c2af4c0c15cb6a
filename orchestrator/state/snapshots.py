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


_IN_BATCH = 500
"""Snapshot ids one query names at most: SQLite's statements take a bounded number of values."""


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

    def fork_size(self, snapshot_id: str) -> int:
        """How many children the largest fork of the snapshot made: one more than the largest
        fork index among them (each fork, or batch of submits, numbers its own from 0)."""

    def anchors(self) -> tuple[dict[str, str], list[str]]:
        """What snapshot retention must keep of live episodes: each one's resume point (its
        last recorded snapshot) by episode id; and the snapshots being taken, with those a live
        fork child would restore to run again from its start (`Episode.from_the_start`)."""


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
        found: dict[str, list[str]] = {}
        wanted = list(snapshot_ids)
        with self._sql.read() as db:
            for start in range(0, len(wanted), _IN_BATCH):
                part = wanted[start : start + _IN_BATCH]
                rows = db.execute(
                    f"SELECT id, forked_from FROM episodes WHERE forked_from IN ({','.join('?' * len(part))})"
                    " ORDER BY fork_index, submitted_at, id",
                    tuple(part),
                ).fetchall()
                for r in rows:
                    found.setdefault(r["forked_from"], []).append(r["id"])
        return found

    def fork_size(self, snapshot_id: str) -> int:
        with self._sql.read() as db:
            row = db.execute(
                "SELECT MAX(fork_index) AS largest FROM episodes WHERE forked_from = ?", (snapshot_id,)
            ).fetchone()
        return int(row["largest"]) + 1 if row is not None and row["largest"] is not None else 0

    def anchors(self) -> tuple[dict[str, str], list[str]]:
        with self._sql.read() as db:
            rows = db.execute(
                "SELECT id, last_snapshot_id, pending_snapshot_id, forked_from FROM episodes WHERE finished_at = 0"
                " AND (last_snapshot_id != '' OR pending_snapshot_id != '' OR forked_from != '')"
            ).fetchall()
        resume = {r["id"]: r["last_snapshot_id"] for r in rows if r["last_snapshot_id"]}
        kept = {r[column] for r in rows for column in ("pending_snapshot_id", "forked_from") if r[column]}
        return resume, sorted(kept)
