"""Groups of episodes submitted together (a GRPO group): the group's record and its members. A
group is stored in the transaction that submits its members (`join`)."""

from __future__ import annotations

import time
from typing import Protocol

from orchestrator.domain import Episode, Group, InvalidArgument, NotFound
from orchestrator.state import records
from orchestrator.state.sql import Connection, Sql


class Groups(Protocol):
    def get(self, group_id: str) -> Group:
        """NotFound if there is no such group."""

    def all(self) -> list[Group]:
        """Every group, oldest first."""

    def members(self, group_id: str) -> list[Episode]:
        """The group's episodes, in index order."""


def join(db: Connection, group: Group, members: int) -> None:
    """Store `group`, or check it against the group of its id stored already (InvalidArgument
    naming the field that differs). Members are submitted all at once: `members` must be the
    group's size."""
    if members != group.size:
        raise InvalidArgument("group.size", f"is {group.size}, but {members} members were submitted")
    row = db.execute("SELECT * FROM episode_groups WHERE id = ?", (group.id,)).fetchone()
    if row is not None:
        group.same_as(records.group_from_row(row))
        return
    db.execute(
        "INSERT INTO episode_groups (id, task_id, size, max_staleness, created_at) VALUES (?,?,?,?,?)",
        (group.id, group.task_id, group.size, group.max_staleness, time.time()),
    )


class SqlGroups:
    def __init__(self, sql: Sql) -> None:
        self._sql = sql

    def get(self, group_id: str) -> Group:
        with self._sql.read() as db:
            row = db.execute("SELECT * FROM episode_groups WHERE id = ?", (group_id,)).fetchone()
        if row is None:
            raise NotFound(f"group {group_id!r} does not exist")
        return records.group_from_row(row)

    def all(self) -> list[Group]:
        with self._sql.read() as db:
            rows = db.execute("SELECT * FROM episode_groups ORDER BY created_at, id").fetchall()
        return [records.group_from_row(r) for r in rows]

    def members(self, group_id: str) -> list[Episode]:
        with self._sql.read() as db:
            rows = db.execute(
                "SELECT * FROM episodes WHERE group_id = ? ORDER BY group_index", (group_id,)
            ).fetchall()
        return [self._sql.dialect.episode(r) for r in rows]
